/* test_clients.c - cmocka unit tests of who is connected (core/clients.c):
 * ids, pages after a cursor by protocol and in all, finding an id, a
 * holder's reservations counted for its listed client, reserved_by, and a
 * random model check: after every step of opens and closes (through the
 * array's compactions), a walk page by page equals the sorted set of live
 * ids. Allocation failures leave a client unlisted, never broken. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core.h"

#define T0 (1000 * BG_SECOND)
#define MAX_CLIENTS 3000

static struct bg_engine engine;
static struct bg_client clients[MAX_CLIENTS];
static int open_[MAX_CLIENTS];

static int setup(void **state)
{
    (void)state;
    memset(clients, 0, sizeof clients);
    memset(open_, 0, sizeof open_);
    return bg_engine_init(&engine, 65535, NULL);
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (open_[i]) bg_client_close(&clients[i], T0);
    bg_engine_destroy(&engine);
    return 0;
}

/* Open client i, listed as protocol p; its id. */
static uint64_t open_client(int i, enum bg_client_protocol p)
{
    assert_int_equal(bg_client_init(&engine, &clients[i], &bg_client_ops_never_wait, NULL), 0);
    open_[i] = 1;
    struct bg_client_entry *x = bg_client_list(&clients[i], p, T0);
    assert_non_null(x);
    assert_ptr_equal(clients[i].listed, x);
    return x->id;
}

static void close_client(int i)
{
    bg_client_close(&clients[i], T0);
    open_[i] = 0;
    assert_null(clients[i].listed);
}

/* Every listed id of protocol p (BG_CLIENT_PROTOCOLS: all), paged through
 * `per` at a time, into ids; returns how many. */
static size_t walk(enum bg_client_protocol p, size_t per, uint64_t *ids)
{
    struct bg_client_entry *page[64];
    size_t n = 0;
    uint64_t after = 0;
    for (;;) {
        int more;
        size_t got = bg_clients_page(&engine, p, after, page, per, &more);
        for (size_t i = 0; i < got; i++) ids[n++] = page[i]->id;
        if (!more) return n;
        assert_int_equal(got, per);
        after = page[got - 1]->id;
    }
}

static void test_ids_pages_and_filters(void **state)
{
    (void)state;
    uint64_t a = open_client(0, BG_CLIENT_BEANSTALK);
    uint64_t b = open_client(1, BG_CLIENT_GEARMAN);
    uint64_t c = open_client(2, BG_CLIENT_BEANSTALK);
    uint64_t d = open_client(3, BG_CLIENT_HTTP);
    assert_true(a < b && b < c && c < d);
    assert_int_equal(bg_clients_count(&engine, BG_CLIENT_PROTOCOLS), 4);
    assert_int_equal(bg_clients_count(&engine, BG_CLIENT_BEANSTALK), 2);
    assert_int_equal(bg_clients_count(&engine, BG_CLIENT_PUSH), 0);
    uint64_t ids[8];
    assert_int_equal(walk(BG_CLIENT_PROTOCOLS, 1, ids), 4);
    assert_true(ids[0] == a && ids[1] == b && ids[2] == c && ids[3] == d);
    assert_int_equal(walk(BG_CLIENT_BEANSTALK, 1, ids), 2);
    assert_true(ids[0] == a && ids[1] == c);
    assert_ptr_equal(bg_client_entry_find(&engine, b), clients[1].listed);
    assert_null(bg_client_entry_find(&engine, 0));
    assert_null(bg_client_entry_find(&engine, d + 1));
    /* a closed id is gone and never comes back */
    close_client(1);
    assert_null(bg_client_entry_find(&engine, b));
    uint64_t e = open_client(1, BG_CLIENT_GEARMAN);
    assert_true(e > d);
    assert_int_equal(walk(BG_CLIENT_PROTOCOLS, 3, ids), 4);
    assert_true(ids[0] == a && ids[1] == c && ids[2] == d && ids[3] == e);
    /* a cursor of a closed client still places the page */
    struct bg_client_entry *page[4];
    int more;
    assert_int_equal(bg_clients_page(&engine, BG_CLIENT_PROTOCOLS, b, page, 4, &more), 3);
    assert_int_equal(page[0]->id, c);
    assert_false(more);
    assert_string_equal(bg_client_protocol_name(BG_CLIENT_PUSH), "push");
    enum bg_client_protocol p;
    assert_int_equal(bg_client_protocol_parse("gearman", 7, &p), 0);
    assert_int_equal(p, BG_CLIENT_GEARMAN);
    assert_int_equal(bg_client_protocol_parse("gear", 4, &p), BG_BAD_FORMAT);
    assert_int_equal(bg_client_protocol_parse("", 0, &p), BG_BAD_FORMAT);
}

static void test_holder_and_reserved_by(void **state)
{
    (void)state;
    open_client(0, BG_CLIENT_PUSH);
    assert_int_equal(bg_client_init_bare(&engine, &clients[1], &bg_client_ops_never_wait, NULL), 0);
    open_[1] = 1;
    bg_client_list_holder(&clients[0], &clients[1]);
    assert_ptr_equal(clients[1].listed, clients[0].listed);
    /* two jobs: the listed client reserves one, the holder the other */
    for (int i = 0; i < 2; i++) {
        struct bg_job *j = bg_job_new(&engine, 0, 0, 60, 3, T0);
        assert_non_null(j);
        memcpy(j->body, "x\r\n", 3);
        assert_int_equal(bg_put(&clients[0], clients[0].use, j, T0), 0);
    }
    struct bg_job *j1 = NULL, *j2 = NULL;
    assert_int_equal(bg_reserve(&clients[0], 0, T0, &j1), 0);
    assert_int_equal(bg_reserve(&clients[0], 0, T0, &j2), 0);
    bg_reservation_transfer(j2, &clients[1]);
    uint64_t ids[4];
    size_t shown;
    assert_int_equal(bg_client_entry_reserved(clients[0].listed, ids, 4, &shown), 2);
    assert_int_equal(shown, 2);
    assert_int_equal(ids[0], j1->id);
    assert_int_equal(ids[1], j2->id);
    assert_int_equal(bg_client_entry_reserved(clients[0].listed, ids, 1, &shown), 2);
    assert_int_equal(shown, 1);
    uint64_t id = clients[0].listed->id;
    assert_int_equal(bg_job_reserved_by(j1), id);
    assert_int_equal(bg_job_reserved_by(j2), id);
    /* the listed client closes first (as push does): the holder forgets it */
    close_client(0);
    assert_null(clients[1].listed);
    assert_int_equal(bg_job_reserved_by(j2), 0);
    close_client(1);
}

static void test_random_model(void **state)
{
    (void)state;
    static uint64_t id_of[MAX_CLIENTS], got[MAX_CLIENTS], want[MAX_CLIENTS];
    srand(26);
    for (int step = 0; step < 20000; step++) {
        int i = rand() % MAX_CLIENTS;
        if (open_[i]) {
            close_client(i);
        } else {
            id_of[i] = open_client(i, (enum bg_client_protocol)(rand() % BG_CLIENT_PROTOCOLS));
        }
        if (step % 500 != 0) continue;
        for (int p = 0; p <= BG_CLIENT_PROTOCOLS; p++) {
            size_t n = 0;
            for (int k = 0; k < MAX_CLIENTS; k++)
                if (open_[k] && (p == BG_CLIENT_PROTOCOLS || clients[k].listed->protocol == p)) want[n++] = id_of[k];
            /* ids ascend in opening order: sort the expected set */
            for (size_t a = 1; a < n; a++)
                for (size_t b = a; b > 0 && want[b - 1] > want[b]; b--) {
                    uint64_t t = want[b];
                    want[b] = want[b - 1];
                    want[b - 1] = t;
                }
            size_t m = walk((enum bg_client_protocol)p, 1 + (size_t)(rand() % 64), got);
            assert_int_equal(m, n);
            assert_memory_equal(got, want, n * sizeof *got);
            assert_int_equal(bg_clients_count(&engine, (enum bg_client_protocol)p), n);
        }
        for (int k = 0; k < MAX_CLIENTS; k++)
            if (open_[k]) assert_ptr_equal(bg_client_entry_find(&engine, id_of[k]), clients[k].listed);
    }
}

static void test_out_of_memory_leaves_it_unlisted(void **state)
{
    (void)state;
    assert_int_equal(bg_client_init(&engine, &clients[0], &bg_client_ops_never_wait, NULL), 0);
    open_[0] = 1;
    bg_alloc_fail_after(1); /* the registry itself */
    assert_null(bg_client_list(&clients[0], BG_CLIENT_BEANSTALK, T0));
    bg_alloc_fail_after(0);
    assert_null(clients[0].listed);
    assert_int_equal(bg_clients_count(&engine, BG_CLIENT_PROTOCOLS), 0);
    open_client(1, BG_CLIENT_BEANSTALK);
    bg_alloc_fail_after(1); /* the entry */
    assert_null(bg_client_list(&clients[0], BG_CLIENT_BEANSTALK, T0));
    bg_alloc_fail_after(0);
    assert_int_equal(bg_clients_count(&engine, BG_CLIENT_PROTOCOLS), 1);
    close_client(0);
    close_client(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ids_pages_and_filters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_holder_and_reserved_by, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_memory_leaves_it_unlisted, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
