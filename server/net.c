/* net.c - socket reads and writes for the Gearman connections, until they
 * move onto the connection layer (io/conn.c). */
#include <errno.h>
#include <unistd.h>

#include "server.h"

int net_write_out(int fd, struct bg_buf *out, struct event *write_ev)
{
    while (out->len) {
        ssize_t n = write(fd, bg_buf_head(out), out->len);
        if (n > 0) {
            bg_buf_consume(out, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_add(write_ev, NULL);
            return 0;
        }
        return -1;
    }
    event_del(write_ev);
    return 0;
}

int net_read_in(int fd, struct bg_buf *in, size_t chunk, uint8_t *eof)
{
    char *tail = bg_buf_reserve(in, chunk);
    if (!tail) return -1;
    ssize_t n = read(fd, tail, chunk);
    if (n > 0) in->len += (size_t)n;
    else if (n == 0) *eof = 1;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    return 0;
}
