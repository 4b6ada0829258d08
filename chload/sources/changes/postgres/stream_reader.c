/* chload's native replication stream reader (stream_native.py builds and binds it).
 *
 * Why: a followed table's changes come as one CopyData message each; read in Python,
 * each costs the interpreter (shared with the conversion and the engine). Here the
 * libpq connection psycopg holds (its PGconn pointer) is read by C with the GIL
 * released (ctypes): each 'w' message's plugin text written as one line of the spool
 * segment (BEGIN and COMMIT messages not written), as replication.py's Python loop
 * writes them.
 *
 * libpq's functions are not linked: Python passes the addresses of those of the libpq
 * already loaded in the process that made the PGconn (psycopg's own, or the system's).
 *
 * Positions stay Python's (replication.py): a call returns
 * - CHL_PG_COMMIT at a commit whose position matters: the first one once `stop` is set
 *   (a keepalive came amid its transaction), once `room` bytes are written or once
 *   `batch` messages are read;
 * - CHL_PG_KEEPALIVE at a keepalive: its sent position and whether a reply is asked;
 * - CHL_PG_IDLE when the wake pipe was written (drained here), or `wait` s after the
 *   call at a moment no message is ready (until then the socket is waited for and read
 *   on without coming back);
 * - CHL_PG_END / CHL_PG_FAILED / CHL_PG_CONSUME when the stream ended or libpq failed
 *   (Python reads the connection's error message); CHL_PG_WRITE when the spool could
 *   not be written (errno in `error`).
 * Commits passed over on the way are folded into `commit_at` (the last one's position)
 * with the bytes and changes written before it: Python applies them as it would have
 * one by one (none of them could seal: not asked for, under `room`).
 * Every byte read is in the spool file when a call returns.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { CHL_PG_COMMIT = 0, CHL_PG_KEEPALIVE = 1, CHL_PG_IDLE = 2, CHL_PG_END = 3,
       CHL_PG_FAILED = 4, CHL_PG_CONSUME = 5, CHL_PG_WRITE = 6, CHL_PG_NOMEM = 7 };

typedef int (*get_copy_data_f)(void *conn, char **buffer, int async);
typedef int (*consume_input_f)(void *conn);
typedef int (*socket_f)(const void *conn);
typedef void (*freemem_f)(void *ptr);

typedef struct {
    /* in */
    int64_t room;          /* bytes the segment may still take before a commit returns */
    int64_t batch;         /* messages after which a commit returns */
    int32_t stop;          /* return at the next commit */
    int32_t in_txn;        /* in and out: a transaction's messages are coming */
    /* out */
    int64_t commit_at;     /* the last commit's position read by this call, or 0 */
    int64_t commit_bytes;  /* bytes written by this call before it */
    int64_t commit_changes;/* changes written by this call before it */
    int64_t bytes;         /* bytes written by this call */
    int64_t changes;       /* changes written by this call */
    int64_t sent;          /* a keepalive's sent position */
    int32_t asked;         /* a keepalive asks a reply */
    int32_t error;         /* errno of a failed write */
} chl_pg_state;

typedef struct {
    get_copy_data_f get_copy_data;
    consume_input_f consume_input;
    socket_f socket;
    freemem_f freemem;
    char *out;
    size_t len, cap;
} chl_pg;

#define HEADER 25 /* 'w', start, end, time */
/* A socket that had to be waited for is read this long after it turns readable: the
 * server sends each change as it decodes it, so a reader that keeps up would otherwise
 * wake (poll, recv) per change. (Data already there is read at once.) */
#define GATHER_NS 1000000L
#define OUT_FLUSH (1 << 20)

static const char BEGIN[] = "{\"action\":\"B\"";
static const char COMMIT[] = "{\"action\":\"C\"";

void *chl_pg_open(void *get_copy_data, void *consume_input, void *socket, void *freemem) {
    chl_pg *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->get_copy_data = (get_copy_data_f)get_copy_data;
    h->consume_input = (consume_input_f)consume_input;
    h->socket = (socket_f)socket;
    h->freemem = (freemem_f)freemem;
    h->cap = OUT_FLUSH * 2;
    h->out = malloc(h->cap);
    if (!h->out) {
        free(h);
        return NULL;
    }
    return h;
}

void chl_pg_close(void *handle) {
    chl_pg *h = handle;
    if (!h) return;
    free(h->out);
    free(h);
}

static int64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return (int64_t)v;
}

static int flush_out(chl_pg *h, int fd, chl_pg_state *st) {
    size_t at = 0;
    while (at < h->len) {
        ssize_t n = write(fd, h->out + at, h->len - at);
        if (n < 0) {
            if (errno == EINTR) continue;
            st->error = errno;
            return -1;
        }
        at += (size_t)n;
    }
    h->len = 0;
    return 0;
}

static int put_line(chl_pg *h, int fd, chl_pg_state *st, const char *s, size_t n) {
    if (h->len + n + 1 > h->cap) {
        if (flush_out(h, fd, st)) return -1;
        if (n + 1 > h->cap) {  /* a change larger than the buffer: written as it is */
            size_t at = 0;
            while (at < n) {
                ssize_t w = write(fd, s + at, n - at);
                if (w < 0) {
                    if (errno == EINTR) continue;
                    st->error = errno;
                    return -1;
                }
                at += (size_t)w;
            }
            h->out[h->len++] = '\n';
            return 0;
        }
    }
    memcpy(h->out + h->len, s, n);
    h->len += n;
    h->out[h->len++] = '\n';
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Wait up to `wait` s for the socket or the wake pipe: 1 input consumed, 0 woken (the
 * pipe drained) or nothing came, or CHL_PG_CONSUME. */
static int await_input(chl_pg *h, void *conn, int wake, double wait) {
    struct pollfd fds[2];
    fds[0].fd = h->socket(conn);
    fds[0].events = POLLIN;
    fds[1].fd = wake;
    fds[1].events = POLLIN;
    fds[0].revents = fds[1].revents = 0;
    int waited = 0, n = poll(fds, 2, 0);
    if (n == 0) {
        waited = 1;
        n = poll(fds, 2, (int)(wait * 1000) + 1);
    }
    if (n < 0 && errno == EINTR) return 1;  /* (asked again, within the time) */
    if (n <= 0) return 0;
    if (fds[1].revents & POLLIN) {
        char drain[4096];
        while (read(wake, drain, sizeof drain) == (ssize_t)sizeof drain) {}
        return 0;
    }
    if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
        struct timespec gather = {0, GATHER_NS};
        if (waited && !(fds[0].revents & (POLLERR | POLLHUP))) nanosleep(&gather, NULL);
        if (!h->consume_input(conn)) return -CHL_PG_CONSUME;
        return 1;
    }
    return 0;
}

int chl_pg_next(void *handle, void *conn, int fd, int wake, double wait, chl_pg_state *st) {
    chl_pg *h = handle;
    int64_t messages = 0, written = 0;
    int code;
    st->commit_at = st->commit_bytes = st->commit_changes = 0;
    st->bytes = st->changes = st->sent = 0;
    st->asked = st->error = 0;
    h->len = 0;
    double until = now_s() + wait;
    for (;;) {
        char *buf = NULL;
        int n = h->get_copy_data(conn, &buf, 1);
        if (n == 0) {  /* (what is read written out before waiting) */
            if (flush_out(h, fd, st)) return CHL_PG_WRITE;
            double left = until - now_s();
            if (left <= 0) {  /* (Python's turn at least once in `wait` s) */
                code = CHL_PG_IDLE;
                break;
            }
            int got = await_input(h, conn, wake, left);
            if (got < 0) return -got;
            if (got) continue;
            code = CHL_PG_IDLE;
            break;
        }
        if (n < 0) {
            code = n == -1 ? CHL_PG_END : CHL_PG_FAILED;
            break;
        }
        const unsigned char *m = (const unsigned char *)buf;
        messages++;
        if (m[0] == 'w') {
            size_t head = (size_t)n < HEADER ? (size_t)n : HEADER;
            const char *text = buf + head;
            size_t len = (size_t)n - head;
            if (len >= 13 && memcmp(text, BEGIN, 13) == 0) {
                st->in_txn = 1;
            } else if (len >= 13 && memcmp(text, COMMIT, 13) == 0) {
                st->in_txn = 0;
                st->commit_at = be64(m + 1);  /* its start field: the commit record's end */
                st->commit_bytes = written;
                st->commit_changes = st->changes;
                if (st->stop || written >= st->room || messages >= st->batch) {
                    h->freemem(buf);
                    code = CHL_PG_COMMIT;
                    break;
                }
            } else {
                if (put_line(h, fd, st, text, len)) {
                    h->freemem(buf);
                    return CHL_PG_WRITE;
                }
                written += (int64_t)len + 1;
                st->changes++;
            }
        } else if (m[0] == 'k' && n >= 18) {
            st->sent = be64(m + 1);
            st->asked = m[17];
            h->freemem(buf);
            code = CHL_PG_KEEPALIVE;
            break;
        }
        h->freemem(buf);
    }
    st->bytes = written;
    if (flush_out(h, fd, st)) return CHL_PG_WRITE;
    return code;
}
