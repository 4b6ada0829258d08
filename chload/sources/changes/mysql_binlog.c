/* chload's native binlog reader (mysql_binlog_native.py builds and binds it).
 *
 * Why: a binlog of small transactions is mostly event framing and rows events of one
 * row; read in Python, each event costs the interpreter (and the commits of the units
 * before it share that interpreter). Here the binlog connection's socket, once
 * mysql_binlog.py has asked for the binlog on it (COM_BINLOG_DUMP), is read by C:
 * packets split, events split, the followed table's rows events written as TSV lines
 * (the same text as mysql_rows.py) into the unit's spool, transaction by transaction.
 * ctypes releases the GIL for each call, so the commits run meanwhile.
 *
 * What is not handled here goes back to Python as one event (CHL_EVENT), which
 * mysql_binlog.py handles as before: a table map of the followed table not seen
 * byte for byte, a rotate, a query other than BEGIN/COMMIT (DDL), an error packet, a
 * compressed event, a rows event of a table whose columns are not all of the types
 * below (a column list of -1 kinds), and a rows event holding a value whose text is
 * made in Python (a date that is not a plain valid one, a non-FULL image): its lines
 * are then made by mysql_rows.py and appended here (chl_bl_append), in order.
 *
 * The unit's lines: whole transactions are written; the lines of the transaction being
 * read wait in `pend` until its XID (or COMMIT). Calls return only between
 * transactions, except CHL_EVENT.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { CHL_UNIT = 0, CHL_EXHAUSTED = 1, CHL_TICK = 2, CHL_EVENT = 3, CHL_END = 4,
       CHL_LOST = 5, CHL_WRITE = 6, CHL_NOMEM = 7 };
enum { K_INT = 1, K_DECIMAL = 2, K_DATETIME2 = 3, K_TIMESTAMP2 = 4, K_DATE = 5,
       K_STRING = 6, K_YEAR = 7 };
#define BAIL (-1) /* a value made in Python: the event goes back whole */

typedef struct {
    unsigned char *p;
    size_t len, cap;
} buf_t;

typedef struct {
    int fd, checksum;
    uint64_t base;               /* position(log_file, 0) */
    buf_t in;                    /* socket bytes read, not yet split */
    size_t in_at;
    buf_t ev;                    /* the current event's packet (its 0x00 first) */
    buf_t out;                   /* lines: [0, done) whole transactions, then pending */
    size_t done;
    long long pend_rows;
    /* the followed table */
    char schema[256], table[256];
    int schema_len, table_len;
    buf_t map;                   /* the table map body the columns below are for */
    uint64_t mapped_id;          /* the table id of its rows (mode 0: none) */
    int mode;                    /* 0 no map, 1 native, 2 rows events to Python */
    int ncols, *kind, *a, *b;
    int nplaces, *places, nkeys, *keys;
    /* a row's fields: two images (before, after) */
    buf_t f[2];
    size_t *off[2], *flen[2];
    char err[256];
} chl_bl;

static int grow(buf_t *b, size_t need) {
    if (b->len + need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < b->len + need) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int put(buf_t *b, const void *s, size_t n) {
    if (grow(b, n)) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

chl_bl *chl_bl_open(int fd, int checksum, unsigned long long base, const char *schema,
                    const char *table) {
    chl_bl *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->fd = fd;
    h->checksum = checksum;
    h->base = base;
    h->schema_len = (int)strlen(schema) < 255 ? (int)strlen(schema) : 255;
    h->table_len = (int)strlen(table) < 255 ? (int)strlen(table) : 255;
    memcpy(h->schema, schema, h->schema_len);
    memcpy(h->table, table, h->table_len);
    return h;
}

static void free_columns(chl_bl *h) {
    free(h->kind); free(h->a); free(h->b); free(h->places); free(h->keys);
    for (int i = 0; i < 2; i++) { free(h->off[i]); free(h->flen[i]); h->off[i] = NULL;
        h->flen[i] = NULL; }
    h->kind = h->a = h->b = h->places = h->keys = NULL;
    h->ncols = h->nplaces = h->nkeys = 0;
}

void chl_bl_close(chl_bl *h) {
    if (!h) return;
    free_columns(h);
    free(h->in.p); free(h->ev.p); free(h->out.p); free(h->map.p);
    free(h->f[0].p); free(h->f[1].p);
    free(h);
}

/* A new connection (read again from the last whole transaction): nothing pending. */
void chl_bl_reset(chl_bl *h, int fd, int checksum, unsigned long long base) {
    h->fd = fd;
    h->checksum = checksum;
    h->base = base;
    h->in.len = h->in_at = 0;
    h->out.len = h->done;
    h->pend_rows = 0;
    h->mode = 0;
}

void chl_bl_base(chl_bl *h, unsigned long long base) { h->base = base; }

/* The followed table's map (its body, the columns' kinds; ncols < 0: its rows events
 * go to Python) for table id `id`; mode 0 unmaps. */
int chl_bl_map(chl_bl *h, int mode, unsigned long long id, const unsigned char *body,
               size_t len, int ncols, const int *kind, const int *a, const int *b) {
    if (mode == 0) {
        if (h->mode && h->mapped_id == id) h->mode = 0;
        return 0;
    }
    h->mapped_id = id;
    h->mode = mode;
    if (mode != 1) return 0;
    h->map.len = 0;
    if (put(&h->map, body, len)) return -1;
    free_columns(h);
    h->ncols = ncols;
    h->kind = malloc(sizeof(int) * (ncols + 1));
    h->a = malloc(sizeof(int) * (ncols + 1));
    h->b = malloc(sizeof(int) * (ncols + 1));
    for (int i = 0; i < 2; i++) {
        h->off[i] = malloc(sizeof(size_t) * (ncols + 1));
        h->flen[i] = malloc(sizeof(size_t) * (ncols + 1));
        if (!h->off[i] || !h->flen[i]) return -1;
    }
    if (!h->kind || !h->a || !h->b) return -1;
    memcpy(h->kind, kind, sizeof(int) * ncols);
    memcpy(h->a, a, sizeof(int) * ncols);
    memcpy(h->b, b, sizeof(int) * ncols);
    return 0;
}

/* The lines' columns: each its place in the image (-1: NULL), and the key's places. */
int chl_bl_order(chl_bl *h, int nplaces, const int *places, int nkeys, const int *keys) {
    free(h->places); free(h->keys);
    h->places = malloc(sizeof(int) * (nplaces + 1));
    h->keys = malloc(sizeof(int) * (nkeys + 1));
    if (!h->places || !h->keys) return -1;
    memcpy(h->places, places, sizeof(int) * nplaces);
    memcpy(h->keys, keys, sizeof(int) * nkeys);
    h->nplaces = nplaces;
    h->nkeys = nkeys;
    return 0;
}

/* Lines made in Python (one rows event's), pending with the transaction. */
int chl_bl_append(chl_bl *h, const unsigned char *lines, size_t len, long long rows) {
    if (put(&h->out, lines, len)) return -1;
    h->pend_rows += rows;
    return 0;
}

const unsigned char *chl_bl_event(chl_bl *h, size_t *len) {
    *len = h->ev.len;
    return h->ev.p;
}

/* ---- values ---- */

/* cp1252's 0x80-0x9F (0: undefined) */
static const unsigned short CP1252[32] = {
    0x20AC, 0, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
    0x2039, 0x0152, 0, 0x017D, 0, 0, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013,
    0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0, 0x017E, 0x0178};
static const int DIGITS[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
static const int DAYS[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

static uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int fmt(buf_t *o, const char *f, long long x, unsigned long long u, int unsig) {
    if (grow(o, 32)) return -1;
    int n = unsig ? snprintf((char *)o->p + o->len, 32, f, u)
                  : snprintf((char *)o->p + o->len, 32, f, x);
    o->len += n;
    return 0;
}

static size_t fraction(const unsigned char *p, int fsp, char *text) {
    /* ".ffffff"[:fsp + 1] as mysql_rows._fraction: microseconds, then fsp digits */
    int size = (fsp + 1) / 2;
    long long v = (long long)be(p, size);
    if (fsp % 2) v /= 10;
    for (int i = fsp; i < 6; i++) v *= 10;
    char six[16];
    snprintf(six, sizeof six, "%06lld", v);
    text[0] = '.';
    memcpy(text + 1, six, fsp);
    return (size_t)fsp + 1;
}

/* One value's text into `o` at `*p` (its bytes end at `end`); BAIL: made in Python. */
static int value(chl_bl *h, int i, const unsigned char *d, size_t *p, size_t end, buf_t *o) {
    int a = h->a[i], b = h->b[i];
    size_t at = *p;
    char text[96];
    switch (h->kind[i]) {
    case K_INT: {
        if (at + a > end) return BAIL;
        uint64_t v = le(d + at, a);
        *p = at + a;
        if (!b) return fmt(o, "%llu", 0, v, 1);
        int shift = 64 - 8 * a;
        return fmt(o, "%lld", (long long)(v << shift) >> shift, 0, 0);
    }
    case K_YEAR:
        if (at + 1 > end) return BAIL;
        *p = at + 1;
        return fmt(o, "%lld", d[at] ? d[at] + 1900 : 0, 0, 0);
    case K_STRING: {
        if (at + a > end) return BAIL;
        size_t n = (size_t)le(d + at, a);
        at += a;
        if (at + n > end) return BAIL;
        if (grow(o, 3 * n)) return -1;
        unsigned char *w = o->p + o->len;
        for (size_t k = 0; k < n; k++) {
            unsigned char c = d[at + k];
            if (b && c >= 0x80) {  /* latin1 (Python's cp1252) into UTF-8 */
                unsigned u = c >= 0xA0 ? c : CP1252[c - 0x80];
                if (!u) return BAIL;  /* (a byte cp1252 leaves undefined: Python's) */
                if (u < 0x800) {
                    *w++ = (unsigned char)(0xC0 | u >> 6);
                } else {
                    *w++ = (unsigned char)(0xE0 | u >> 12);
                    *w++ = (unsigned char)(0x80 | (u >> 6 & 63));
                }
                *w++ = (unsigned char)(0x80 | (u & 63));
                continue;
            }
            switch (c) {
            case '\\': *w++ = '\\'; *w++ = '\\'; break;
            case '\t': *w++ = '\\'; *w++ = 't'; break;
            case '\n': *w++ = '\\'; *w++ = 'n'; break;
            case '\r': *w++ = '\\'; *w++ = 'r'; break;
            case 0: *w++ = '\\'; *w++ = '0'; break;
            default: *w++ = c;
            }
        }
        o->len = (size_t)(w - o->p);
        *p = at + n;
        return 0;
    }
    case K_DATE: {
        if (at + 3 > end) return BAIL;
        unsigned v = (unsigned)le(d + at, 3);
        *p = at + 3;
        int y = v >> 9, m = (v >> 5) & 15, dd = v & 31;
        int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        if (y < 1 || y > 9999 || m < 1 || m > 12 || dd < 1 ||
            dd > DAYS[m] + (m == 2 && leap))
            return put(o, "\\N", 2);
        int n = snprintf(text, sizeof text, "%04d-%02d-%02d", y, m, dd);
        return put(o, text, n);
    }
    case K_DATETIME2: {
        int size = (a + 1) / 2;
        if (at + 5 + size > end) return BAIL;
        uint64_t v = be(d + at, 5);
        unsigned ym = (v >> 22) & 0x1FFFF;
        int y = ym / 13, m = ym % 13, dd = (v >> 17) & 31;
        int hh = (v >> 12) & 31, mi = (v >> 6) & 63, ss = v & 63;
        if (!(y >= 1000 && m >= 1 && m <= 12 && dd >= 1 && dd <= DAYS[m] && hh < 24 &&
              mi < 60 && ss < 60))
            return BAIL;
        int n = snprintf(text, sizeof text, "%04d-%02d-%02d %02d:%02d:%02d", y, m, dd, hh,
                         mi, ss);
        if (a) n += (int)fraction(d + at + 5, a, text + n);
        *p = at + 5 + size;
        return put(o, text, n);
    }
    case K_TIMESTAMP2: {
        int size = (a + 1) / 2;
        if (at + 4 + size > end) return BAIL;
        time_t t = (time_t)be(d + at, 4);
        struct tm tm;
        if (!gmtime_r(&t, &tm)) return BAIL;
        int n = snprintf(text, sizeof text, "%04d-%02d-%02d %02d:%02d:%02d",
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                         tm.tm_min, tm.tm_sec);
        if (a) n += (int)fraction(d + at + 4, a, text + n);
        *p = at + 4 + size;
        return put(o, text, n);
    }
    case K_DECIMAL: {
        int whole = a - b, head = DIGITS[whole % 9], full = whole / 9;
        int frac_full = b / 9, tail = DIGITS[b % 9], tail_digits = b % 9;
        int size = head + 4 * full + 4 * frac_full + tail;
        if (size > 40 || at + size > end) return BAIL;
        unsigned char raw[40];
        memcpy(raw, d + at, size);
        int negative = !(raw[0] & 0x80);
        raw[0] ^= 0x80;
        if (negative)
            for (int k = 0; k < size; k++) raw[k] ^= 0xFF;
        *p = at + size;
        int n = 0, started = 0, k = head;
        if (negative) text[n++] = '-';
        uint32_t g = (uint32_t)be(raw, head);
        if (g) { n += snprintf(text + n, sizeof text - n, "%u", g); started = 1; }
        for (int j = 0; j < full; j++, k += 4) {
            g = (uint32_t)be(raw + k, 4);
            if (started) n += snprintf(text + n, sizeof text - n, "%09u", g);
            else if (g) { n += snprintf(text + n, sizeof text - n, "%u", g); started = 1; }
        }
        if (!started) text[n++] = '0';
        if (b) {
            text[n++] = '.';
            for (int j = 0; j < frac_full; j++, k += 4)
                n += snprintf(text + n, sizeof text - n, "%09u", (uint32_t)be(raw + k, 4));
            if (tail)
                n += snprintf(text + n, sizeof text - n, "%0*u", tail_digits,
                              (uint32_t)be(raw + k, tail));
        }
        return put(o, text, n);
    }
    }
    return BAIL;
}

/* One row image at `*p`: its fields' texts in h->f[w]. */
static int row(chl_bl *h, int w, const unsigned char *d, size_t *p, size_t end) {
    int width = (h->ncols + 7) / 8;
    if (*p + width > end) return BAIL;
    const unsigned char *nulls = d + *p;
    *p += width;
    buf_t *o = &h->f[w];
    o->len = 0;
    for (int i = 0; i < h->ncols; i++) {
        h->off[w][i] = o->len;
        if (nulls[i >> 3] >> (i & 7) & 1) {
            if (put(o, "\\N", 2)) return -1;
        } else {
            int r = value(h, i, d, p, end, o);
            if (r) return r;
        }
        h->flen[w][i] = o->len - h->off[w][i];
    }
    return 0;
}

static int line(chl_bl *h, int w, uint64_t version, int deleted) {
    buf_t *o = &h->out, *f = &h->f[w];
    for (int j = 0; j < h->nplaces; j++) {
        int i = h->places[j];
        if (j && put(o, "\t", 1)) return -1;
        if (i < 0) {
            if (put(o, "\\N", 2)) return -1;
        } else if (put(o, f->p + h->off[w][i], h->flen[w][i])) {
            return -1;
        }
    }
    char tail[48];
    int n = snprintf(tail, sizeof tail, "\t%llu\t%d\n", (unsigned long long)version, deleted);
    return put(o, tail, n);
}

/* A rows event of the followed table into pending lines; BAIL leaves them as before. */
static int rows_event(chl_bl *h, const unsigned char *d, size_t end, int kind,
                      uint64_t here) {
    int update = kind == 24 || kind == 31, del = kind == 25 || kind == 32;
    size_t p = kind < 30 ? 28 : 28 + (size_t)le(d + 28, 2);
    int images = update ? 2 : 1, width = (h->ncols + 7) / 8;
    if (h->ncols >= 251 || p + 1 + (size_t)images * width > end || d[p] != h->ncols)
        return BAIL;
    p++;
    for (int im = 0; im < images; im++)  /* every column, spare bits clear */
        for (int i = 0; i < width; i++) {
            int bits = h->ncols - 8 * i >= 8 ? 8 : h->ncols - 8 * i;
            if (d[p + im * width + i] != ((1u << bits) - 1)) return BAIL;
        }
    p += (size_t)images * width;
    size_t mark = h->out.len;
    long long made = 0;
    while (p < end) {
        int r = row(h, 0, d, &p, end);
        if (!r && update) {
            r = row(h, 1, d, &p, end);
            if (!r) {
                int moved = 0;
                for (int k = 0; k < h->nkeys && !moved; k++) {
                    int i = h->keys[k];
                    moved = h->flen[0][i] != h->flen[1][i] ||
                            memcmp(h->f[0].p + h->off[0][i], h->f[1].p + h->off[1][i],
                                   h->flen[0][i]);
                }
                if (moved) { r = line(h, 0, here, 1); made++; }
                if (!r) { r = line(h, 1, here, 0); made++; }
            }
        } else if (!r) {
            r = line(h, 0, here, del);
            made++;
        }
        if (r) {
            h->out.len = mark;
            return r;
        }
    }
    h->pend_rows += made;
    return 0;
}

/* ---- the stream ---- */

/* The whole transactions written to `out`, the pending lines kept. */
static int flush(chl_bl *h, int out) {
    size_t at = 0;
    while (at < h->done) {
        ssize_t n = write(out, h->out.p + at, h->done - at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            snprintf(h->err, sizeof h->err, "writing the unit's spool: %s", strerror(errno));
            return -1;
        }
        at += (size_t)n;
    }
    memmove(h->out.p, h->out.p + h->done, h->out.len - h->done);
    h->out.len -= h->done;
    h->done = 0;
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* `n` more bytes in h->in past h->in_at, read from the socket; 1: none came within
 * `wait` seconds (wait < 0: as long as it takes); -1: the connection is lost. */
static int need(chl_bl *h, size_t n, double wait) {
    if (h->in.len - h->in_at >= n) return 0;
    if (h->in_at) {
        memmove(h->in.p, h->in.p + h->in_at, h->in.len - h->in_at);
        h->in.len -= h->in_at;
        h->in_at = 0;
    }
    if (grow(&h->in, n < (1 << 20) ? (1 << 20) : n)) return -1;
    while (h->in.len < n) {
        struct pollfd pf = {h->fd, POLLIN, 0};
        int ready = poll(&pf, 1, wait < 0 ? 1000 : (int)(wait * 1000) + 1);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) goto lost;
        if (ready == 0) {
            if (wait >= 0) return 1;
            continue;
        }
        ssize_t got = recv(h->fd, h->in.p + h->in.len, h->in.cap - h->in.len, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) {
            if (got == 0) errno = ECONNRESET;
            goto lost;
        }
        h->in.len += (size_t)got;
        wait = -1;  /* a packet begun is read to its end */
    }
    return 0;
lost:
    snprintf(h->err, sizeof h->err, "Lost connection to server during query (%s)",
             strerror(errno));
    return -1;
}

/* The next packet whole into h->ev (a packet of 16 MiB or more: its parts joined). */
static int packet(chl_bl *h, double wait) {
    h->ev.len = 0;
    for (;;) {
        int r = need(h, 4, wait);
        if (r) return r;
        const unsigned char *q = h->in.p + h->in_at;
        size_t size = q[0] | q[1] << 8 | (size_t)q[2] << 16;
        if ((r = need(h, 4 + size, -1))) return r;
        if (put(&h->ev, h->in.p + h->in_at + 4, size)) return -1;
        h->in_at += 4 + size;
        if (size != 0xFFFFFF) return 0;
        wait = -1;
    }
}

static int is_word(const unsigned char *s, size_t n, const char *word) {
    while (n && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) { s++; n--; }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        n--;
    size_t w = strlen(word);
    if (n != w) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c >= 'a' && c <= 'z') c -= 32;
        if (c != (unsigned char)word[i]) return 0;
    }
    return 1;
}

/* Whether a table map names the followed table. */
static int followed(chl_bl *h, const unsigned char *d, size_t end) {
    size_t at = 28;
    if (at + 1 > end) return 0;
    int sl = d[at];
    if (at + 1 + sl + 2 > end) return 0;
    const unsigned char *schema = d + at + 1;
    at += sl + 2;
    int tl = d[at];
    if (at + 1 + tl > end) return 0;
    return sl == h->schema_len && !memcmp(schema, h->schema, sl) && tl == h->table_len &&
           !memcmp(d + at + 1, h->table, tl);
}

/* Read on until a unit may end or Python must see an event (see the codes above):
 * `rows` lines or more written (whole transactions), the position `end` reached (0:
 * none), `tick` seconds passed between transactions. `*made`: the lines written by
 * this call; `*at`: the position after the last transaction written (0: none);
 * `*pending`: lines wait for their transaction's end; `*here`: an event's position. */
int chl_bl_next(chl_bl *h, int out, long long rows, unsigned long long end, double tick,
                long long *made, unsigned long long *at, int *pending,
                unsigned long long *here) {
    double until = now() + tick;
    int code;
    *made = 0;
    *at = 0;
    for (;;) {
        int between = h->out.len == h->done && h->pend_rows == 0;
        if (between) {
            if (*made >= rows) { code = CHL_UNIT; break; }
            if (end && *at >= end) { code = CHL_EXHAUSTED; break; }
        }
        double left = until - now();
        if (between && left <= 0) { code = CHL_TICK; break; }
        int r = packet(h, between ? left : -1);
        if (r == 1) { code = CHL_TICK; break; }
        if (r < 0) { code = errno == ENOMEM ? CHL_NOMEM : CHL_LOST; break; }
        const unsigned char *d = h->ev.p;
        size_t n = h->ev.len;
        if (!n || d[0] != 0) {
            if (n && d[0] == 0xFE && n < 9) { code = CHL_END; break; }
            if (n && d[0] == 0xFF) { code = CHL_EVENT; *here = 0; break; }
            continue;
        }
        if (n < 20) continue;
        int kind = d[5];
        uint32_t size = (uint32_t)le(d + 10, 4), log_pos = (uint32_t)le(d + 14, 4);
        size_t stop = 1 + (size_t)size - (h->checksum ? 4 : 0);
        if (stop > n) stop = n;
        *here = log_pos ? (h->base | log_pos) : 0;
        if (kind == 23 || kind == 24 || kind == 25 || kind == 30 || kind == 31 ||
            kind == 32) {
            if (!h->mode || le(d + 20, 6) != h->mapped_id) continue;
            if (h->mode == 2) { code = CHL_EVENT; break; }
            r = rows_event(h, d, stop, kind, *here);
            if (r == BAIL) { code = CHL_EVENT; break; }
            if (r) { code = CHL_NOMEM; break; }
        } else if (kind == 19) {  /* table map */
            if (!followed(h, d, stop)) {
                if (h->mode && le(d + 20, 6) == h->mapped_id) h->mode = 0;
                continue;
            }
            if (h->mode == 1 && stop - 20 == h->map.len &&
                !memcmp(d + 20, h->map.p, h->map.len))
                continue;
            code = CHL_EVENT;
            break;
        } else if (kind == 16 ||  /* XID, or a query: BEGIN, COMMIT, else Python's */
                   (kind == 2 && n > 33)) {
            if (kind == 2) {
                size_t q = 33 + le(d + 31, 2) + d[28] + 1;
                if (q > stop) continue;
                if (is_word(d + q, stop - q, "BEGIN")) continue;
                if (!is_word(d + q, stop - q, "COMMIT")) { code = CHL_EVENT; break; }
            }
            *made += h->pend_rows;
            h->pend_rows = 0;
            h->done = h->out.len;
            *at = *here;
            if (h->done >= (1 << 20) && flush(h, out)) { code = CHL_WRITE; break; }
        } else if (kind == 4 || (kind >= 165 && kind <= 171)) {  /* rotate, compressed */
            code = CHL_EVENT;
            break;
        }
    }
    if (h->done && flush(h, out)) return CHL_WRITE;
    *pending = h->out.len > h->done || h->pend_rows > 0;
    return code;
}

/* The pending lines of a transaction Python saw end (XA COMMIT): whole now. */
long long chl_bl_commit(chl_bl *h, int out) {
    long long n = h->pend_rows;
    h->pend_rows = 0;
    h->done = h->out.len;
    if (flush(h, out)) return -1;
    return n;
}

const char *chl_bl_error(chl_bl *h) { return h->err; }
