/* tree.c - the ordered index of one tube's jobs in one state (issue 26): an
 * AVL tree keyed by (key, id) (struct bg_job_cursor), threaded through the
 * jobs themselves (ready, delayed, buried: left and right are the job's
 * prev and next, its subtrees' heights are in heights) or through the
 * jobs' side records (reserved: the job's links belong to its reserver's
 * list; a reserved job always has a side record).
 *
 * Why not a heap or a B+tree: a heap cannot list in order after a cursor
 * at a bounded cost; a B+tree of job pointers can, and reads less memory
 * per step, but its inserts allocate, and a job that changes state must
 * always have somewhere to go (the engine buries a job it cannot queue,
 * and burying must not fail). The
 * threaded tree never allocates, costs no byte per job (the links are the
 * fields a job in these states does not use otherwise; the heap arrays it
 * replaces cost 8 to 16 bytes a job), and every operation is O(log n)
 * with an explicit path, no recursion: the height of an AVL tree of n
 * nodes is below 1.45 log2(n + 2), so BG_TREE_DEPTH_MAX bounds it for any
 * n that fits in memory.
 */
#include "core.h"

#define BG_TREE_DEPTH_MAX 96

/* The link and height fields of node n, for the tree's kind of node. */
static inline void **left_of(const struct bg_tree *t, void *n)
{
    return t->nodes ? (void **)&((struct bg_job_more *)n)->left : (void **)&((struct bg_job *)n)->prev;
}
static inline void **right_of(const struct bg_tree *t, void *n)
{
    return t->nodes ? (void **)&((struct bg_job_more *)n)->right : (void **)&((struct bg_job *)n)->next;
}
static inline uint16_t *height_of(const struct bg_tree *t, void *n)
{
    return t->nodes ? &((struct bg_job_more *)n)->heights : &((struct bg_job *)n)->heights;
}
#define L(n) (*left_of(t, (n)))
#define R(n) (*right_of(t, (n)))

struct bg_job *bg_tree_job(const struct bg_tree *t, const void *n)
{
    return t->nodes ? ((const struct bg_job_more *)n)->job : (struct bg_job *)n;
}

struct bg_job_cursor bg_job_key(const struct bg_job *j, enum bg_tree_order order)
{
    struct bg_job_cursor k = {0, j->id};
    if (order == BG_ORDER_PRIORITY) k.key = j->pri;
    else if (order == BG_ORDER_DEADLINE) k.key = j->more->deadline_at; /* delayed and buried jobs have one */
    return k;
}

struct bg_job_cursor bg_tree_key(const struct bg_tree *t, const void *n)
{
    return bg_job_key(bg_tree_job(t, n), (enum bg_tree_order)t->order);
}

static inline int key_less(struct bg_job_cursor a, struct bg_job_cursor b)
{
    return a.key != b.key ? a.key < b.key : a.id < b.id;
}

/* A node's heights field holds the heights of its two subtrees (left in
 * the low byte, right in the next: an AVL tree this deep would not fit in
 * memory), so that balancing reads only the nodes on the path, never a
 * sibling subtree's root (a cache miss on every level of a large tree). */
static inline uint32_t left_height(const struct bg_tree *t, void *n) { return *height_of(t, n) & 0xff; }
static inline uint32_t right_height(const struct bg_tree *t, void *n) { return *height_of(t, n) >> 8 & 0xff; }
static inline void set_heights(const struct bg_tree *t, void *n, uint32_t l, uint32_t r)
{
    *height_of(t, n) = (uint16_t)(l | r << 8);
}

/* The height of the subtree at n (0: none). */
static inline uint32_t height(const struct bg_tree *t, void *n)
{
    if (!n) return 0;
    uint32_t l = left_height(t, n), r = right_height(t, n);
    return 1 + (l > r ? l : r);
}

static void *rotate_right(const struct bg_tree *t, void *n)
{
    void *l = L(n);
    L(n) = R(l);
    R(l) = n;
    set_heights(t, n, right_height(t, l), right_height(t, n));
    set_heights(t, l, left_height(t, l), height(t, n));
    return l;
}

static void *rotate_left(const struct bg_tree *t, void *n)
{
    void *r = R(n);
    R(n) = L(r);
    L(r) = n;
    set_heights(t, n, left_height(t, n), left_height(t, r));
    set_heights(t, r, height(t, n), right_height(t, r));
    return r;
}

/* n (its subtree heights up to date) rotated back into balance if its
 * subtrees differ by 2; returns the subtree's new root. */
static void *rebalance(const struct bg_tree *t, void *n)
{
    uint32_t l = left_height(t, n), r = right_height(t, n);
    if (l > r + 1) {
        void *c = L(n);
        if (left_height(t, c) < right_height(t, c)) {
            L(n) = rotate_left(t, c);
            set_heights(t, n, height(t, L(n)), r);
        }
        return rotate_right(t, n);
    }
    if (r > l + 1) {
        void *c = R(n);
        if (right_height(t, c) < left_height(t, c)) {
            R(n) = rotate_right(t, c);
            set_heights(t, n, l, height(t, R(n)));
        }
        return rotate_left(t, n);
    }
    return n;
}

/* The subtree in slot `changed` (a link of *link[from], or of nothing when
 * from < 0) changed height: record that in each node up the path
 * link[from..0], rebalancing each, until a subtree keeps its height.
 * Returns 1 if one did, 0 if the change reached the slot link[0] itself. */
static int rebalance_path(const struct bg_tree *t, void **link[], int from, void **changed)
{
    for (int i = from; i >= 0; i--) {
        void *n = *link[i];
        uint32_t before = height(t, n), h = height(t, *changed);
        if (changed == left_of(t, n)) set_heights(t, n, h, right_height(t, n));
        else set_heights(t, n, left_height(t, n), h);
        void *m = rebalance(t, n);
        *link[i] = m;
        if (height(t, m) == before) return 1;
        changed = link[i];
    }
    return 0;
}

void bg_tree_init(struct bg_tree *t, enum bg_tree_order order, int nodes)
{
    t->root = t->first = t->last = NULL;
    t->finger = &t->root;
    t->len = 0;
    t->order = (uint8_t)order;
    t->nodes = (uint8_t)(nodes != 0);
}

/* How far below the finger an append keeps it (FINGER_DEPTH to twice that
 * levels): a put then walks a few nodes, not the whole right spine. */
#define FINGER_DEPTH 4

/* Append n after the last node: its place is at the bottom of the right
 * spine. The walk starts at the finger, a slot on the right spine that
 * only appends keep (anything else resets it to the root's): the changes
 * below it stay below it unless the subtree there grows taller, and then
 * the spine above it is walked from the root once. */
static void append(struct bg_tree *t, void *n)
{
    void **link[BG_TREE_DEPTH_MAX];
    int depth = 0;
    void **top = t->finger, **slot = top;
    while (*slot) {
        link[depth++] = slot;
        slot = right_of(t, *slot);
    }
    L(n) = R(n) = NULL;
    set_heights(t, n, 0, 0);
    *slot = n;
    if (rebalance_path(t, link, depth - 1, slot) || top == &t->root) {
        if (depth > 2 * FINGER_DEPTH) { /* nothing above top moved: keep it near the bottom */
            slot = top;
            for (int i = 0; i < FINGER_DEPTH && *right_of(t, *slot); i++) slot = right_of(t, *slot);
            t->finger = slot;
        }
        return;
    }
    /* the subtree at top grew: the spine above it, from the root */
    depth = 0;
    for (slot = &t->root; slot != top; slot = right_of(t, *slot)) link[depth++] = slot;
    rebalance_path(t, link, depth - 1, top);
    t->finger = &t->root; /* rotations above top may have moved it off the spine */
}

void bg_tree_insert(struct bg_tree *t, void *n)
{
    struct bg_job_cursor k = bg_tree_key(t, n);
    if (t->last && key_less(bg_tree_key(t, t->last), k)) {
        /* after the last: a put's new id at a priority already there */
        append(t, n);
        t->last = n;
        t->len++;
        return;
    }
    void **link[BG_TREE_DEPTH_MAX];
    int depth = 0;
    void **slot = &t->root;
    while (*slot) {
        link[depth++] = slot;
        slot = key_less(k, bg_tree_key(t, *slot)) ? left_of(t, *slot) : right_of(t, *slot);
    }
    L(n) = R(n) = NULL;
    set_heights(t, n, 0, 0);
    *slot = n;
    t->len++;
    if (!t->last) t->last = n;
    if (!t->first || key_less(k, bg_tree_key(t, t->first))) t->first = n;
    rebalance_path(t, link, depth - 1, slot);
    t->finger = &t->root;
}

/* The leftmost and rightmost nodes of the subtree at n (n not NULL). */
static void *leftmost(const struct bg_tree *t, void *n)
{
    while (L(n)) n = L(n);
    return n;
}
static void *rightmost(const struct bg_tree *t, void *n)
{
    while (R(n)) n = R(n);
    return n;
}

void *bg_tree_remove(struct bg_tree *t, struct bg_job_cursor k)
{
    void **link[BG_TREE_DEPTH_MAX];
    int depth = 0;
    void **slot = &t->root;
    while (*slot) {
        link[depth++] = slot;
        struct bg_job_cursor nk = bg_tree_key(t, *slot);
        if (!key_less(k, nk) && !key_less(nk, k)) break;
        slot = key_less(k, nk) ? left_of(t, *slot) : right_of(t, *slot);
    }
    void *n = *slot;
    if (!n) return NULL;
    int d = depth - 1; /* link[d] == slot */
    if (!L(n) || !R(n)) {
        *slot = L(n) ? L(n) : R(n);
        rebalance_path(t, link, d - 1, slot);
    } else {
        /* the successor s (leftmost of the right subtree) takes n's place */
        void **s_slot = right_of(t, n);
        link[depth++] = s_slot;
        while (L(*s_slot)) {
            s_slot = left_of(t, *s_slot);
            link[depth++] = s_slot;
        }
        void *s = *s_slot;
        *s_slot = R(s);
        L(s) = L(n);
        R(s) = R(n);
        *height_of(t, s) = *height_of(t, n); /* n's subtrees, now s's */
        *slot = s;
        link[d + 1] = right_of(t, s); /* was n's right link */
        rebalance_path(t, link, depth - 2, link[depth - 1]);
    }
    t->len--;
    t->finger = &t->root;
    if (t->first == n) t->first = t->root ? leftmost(t, t->root) : NULL;
    if (t->last == n) t->last = t->root ? rightmost(t, t->root) : NULL;
    L(n) = R(n) = NULL;
    return n;
}

size_t bg_tree_after(const struct bg_tree *t, struct bg_job_cursor after, struct bg_job **out, size_t max)
{
    void *stack[BG_TREE_DEPTH_MAX];
    int depth = 0;
    /* the path to the first node after `after`: every node on it that
     * comes after `after` is stacked, and is visited after its left side */
    for (void *n = t->root; n;) {
        if (key_less(after, bg_tree_key(t, n))) {
            stack[depth++] = n;
            n = L(n);
        } else {
            n = R(n);
        }
    }
    size_t got = 0;
    while (got < max && depth) {
        void *n = stack[--depth];
        out[got++] = bg_tree_job(t, n);
        for (void *c = R(n); c; c = L(c)) stack[depth++] = c;
    }
    return got;
}

/* The audit's walk over the subtree at n (depth deep): keys within the
 * exclusive bounds lo and hi (NULL: none), the recorded subtree heights
 * equal to the counted ones (*h gets the subtree's), balance; counts the
 * nodes into *count and calls visit on each job. 0 or BG_INTERNAL_ERROR. */
struct audit_walk {
    const struct bg_tree *t;
    uint64_t count;
    const char **broken;
    int (*visit)(const struct bg_job *j, void *arg);
    void *arg;
};

static int sound(struct audit_walk *w, void *n, const struct bg_job_cursor *lo, const struct bg_job_cursor *hi,
                 int depth, uint32_t *h)
{
    const struct bg_tree *t = w->t;
    *h = 0;
    if (!n) return 0;
    if (depth >= BG_TREE_DEPTH_MAX) {
        *w->broken = "an index is deeper than an AVL tree can be";
        return BG_INTERNAL_ERROR;
    }
    struct bg_job_cursor k = bg_tree_key(t, n);
    if ((lo && !key_less(*lo, k)) || (hi && !key_less(k, *hi))) {
        *w->broken = "an index is out of order";
        return BG_INTERNAL_ERROR;
    }
    uint32_t l, r;
    if (sound(w, L(n), lo, &k, depth + 1, &l) || sound(w, R(n), &k, hi, depth + 1, &r))
        return BG_INTERNAL_ERROR;
    if (left_height(t, n) != l || right_height(t, n) != r || l > r + 1 || r > l + 1) {
        *w->broken = "an index's heights or balance are wrong";
        return BG_INTERNAL_ERROR;
    }
    *h = 1 + (l > r ? l : r);
    w->count++;
    if (w->visit && w->visit(bg_tree_job(t, n), w->arg) != 0) {
        *w->broken = "an index holds a job that is not in its state or tube";
        return BG_INTERNAL_ERROR;
    }
    return 0;
}

int bg_tree_audit(const struct bg_tree *t, int (*visit)(const struct bg_job *j, void *arg), void *arg,
                  const char **broken)
{
    struct audit_walk w = {t, 0, broken, visit, arg};
    uint32_t h;
    if (sound(&w, t->root, NULL, NULL, 0, &h) != 0) return BG_INTERNAL_ERROR;
    if (w.count != t->len) {
        *broken = "an index's count is off";
        return BG_INTERNAL_ERROR;
    }
    if (t->first != (t->root ? leftmost(t, t->root) : NULL) ||
        t->last != (t->root ? rightmost(t, t->root) : NULL)) {
        *broken = "an index's cached first or last job is stale";
        return BG_INTERNAL_ERROR;
    }
    void *const *slot = (void *const *)&t->root;
    while (slot != (void *const *)t->finger && *slot) slot = right_of(t, *slot);
    if (slot != (void *const *)t->finger) {
        *broken = "an index's finger is not on its right spine";
        return BG_INTERNAL_ERROR;
    }
    return 0;
}
