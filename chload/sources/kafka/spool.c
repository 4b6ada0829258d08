/* chload's native Kafka reader: offset ranges of partitions into spool files, values
 * joined by '\n', without a Python object per message (docs/sources-kafka.md: the Python
 * reader alone took longer than loading the same rows from a file).
 *
 * Compiled on first use by chload/sources/kafka_native.py with the system `cc` against
 * the librdkafka that confluent-kafka bundles (or the system's librdkafka.so.1); no
 * header is needed: the few prototypes and the two public structs below are
 * librdkafka's stable ABI (rdkafka.h). Called through ctypes, which releases the GIL,
 * so a reader thread runs beside the engine.
 *
 *   chl_open(names, values, n, err, errlen)      a consumer (assign only, no group join)
 *   chl_read(rk, units, n, timeout_ms, err, errlen)
 *       reads every unit [first, last] of its partition at once (one fetch pipeline),
 *       each into its own fd; 0, or -1 with a readable line in err
 *   chl_close(rk)
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;

typedef struct {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

typedef struct {
    char *topic;
    int32_t partition;
    int64_t offset;
    void *metadata;
    size_t metadata_size;
    void *opaque;
    int err;
    void *_private;
} rd_kafka_topic_partition_t;

typedef struct {
    int cnt;
    int size;
    rd_kafka_topic_partition_t *elems;
} rd_kafka_topic_partition_list_t;

#define RD_KAFKA_CONSUMER 1
#define RD_KAFKA_CONF_OK 0
#define RD_KAFKA_CONF_UNKNOWN (-2)
#define ERR_PARTITION_EOF (-191)

rd_kafka_conf_t *rd_kafka_conf_new(void);
int rd_kafka_conf_set(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
void rd_kafka_conf_destroy(rd_kafka_conf_t *);
void rd_kafka_conf_set_log_cb(rd_kafka_conf_t *,
                              void (*)(const rd_kafka_t *, int, const char *, const char *));
void rd_kafka_conf_set_error_cb(rd_kafka_conf_t *,
                                void (*)(rd_kafka_t *, int, const char *, void *));
rd_kafka_t *rd_kafka_new(int, rd_kafka_conf_t *, char *, size_t);
void rd_kafka_destroy(rd_kafka_t *);
int rd_kafka_consumer_close(rd_kafka_t *);
int rd_kafka_poll_set_consumer(rd_kafka_t *);
rd_kafka_queue_t *rd_kafka_queue_get_consumer(rd_kafka_t *);
void rd_kafka_queue_destroy(rd_kafka_queue_t *);
ssize_t rd_kafka_consume_batch_queue(rd_kafka_queue_t *, int, rd_kafka_message_t **, size_t);
void rd_kafka_message_destroy(rd_kafka_message_t *);
int64_t rd_kafka_message_timestamp(const rd_kafka_message_t *, int *);
const char *rd_kafka_topic_name(const rd_kafka_topic_t *);
const char *rd_kafka_err2str(int);
rd_kafka_topic_partition_list_t *rd_kafka_topic_partition_list_new(int);
rd_kafka_topic_partition_t *rd_kafka_topic_partition_list_add(
    rd_kafka_topic_partition_list_t *, const char *, int32_t);
void rd_kafka_topic_partition_list_destroy(rd_kafka_topic_partition_list_t *);
int rd_kafka_assign(rd_kafka_t *, const rd_kafka_topic_partition_list_t *);

/* One unit: Python fills topic..audit and reads the results (kafka_native.Unit). */
typedef struct {
    const char *topic;
    int32_t partition;
    int32_t fd;
    int64_t first;
    int64_t last;            /* inclusive */
    int32_t audit;           /* each row gets the message's _topic, _partition, _offset,
                                _timestamp and _key as its last fields: 1 a JSON object's,
                                2 a CSV line's, 3 a TSV line's (AUDIT_* below) */
    int32_t contiguous;      /* out: row n of the spool is offset first_offset + n - 1 */
    int64_t messages;        /* out: rows written (null values are skipped) */
    int64_t bytes;           /* out: bytes written to fd */
    int64_t first_offset;    /* out: the first message's offset, -1 if none */
    /* internal */
    int64_t expect;
    int32_t done;
    int32_t used;
    rd_kafka_topic_t *rkt;
    char *buf;
} chl_unit;

#define AUDIT_JSON 1
#define AUDIT_CSV 2
#define AUDIT_TSV 3
#define BUF_SIZE (1 << 20)
#define BATCH 8192

static int say(char *err, size_t errlen, const char *fmt, const char *a, long long b) {
    snprintf(err, errlen, fmt, a, b);
    return -1;
}

/* The struct's size, which sources/kafka/native.py checks against its ctypes mirror. */
size_t chl_unit_size(void) { return sizeof(chl_unit); }

/* librdkafka's log and errors (a broker down: a line per retry) would go to stderr;
 * the reader's own error says what failed, and the loader asks the broker why. */
static void quiet_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    (void)rk, (void)level, (void)fac, (void)buf;
}

static void quiet_error(rd_kafka_t *rk, int code, const char *reason, void *opaque) {
    (void)rk, (void)code, (void)reason, (void)opaque;
}

rd_kafka_t *chl_open(const char **names, const char **values, int n, char *err,
                     size_t errlen) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set_log_cb(conf, quiet_log);
    rd_kafka_conf_set_error_cb(conf, quiet_error);
    for (int i = 0; i < n; i++) {
        int optional = names[i][0] == '?'; /* "?name": a setting older librdkafkas lack */
        int res = rd_kafka_conf_set(conf, names[i] + optional, values[i], err, errlen);
        if (res != RD_KAFKA_CONF_OK && !(optional && res == RD_KAFKA_CONF_UNKNOWN)) {
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, errlen);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_poll_set_consumer(rk); /* logs and errors come with the messages */
    return rk;
}

void chl_close(rd_kafka_t *rk) {
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
}

static int flush_all(int fd, const char *buf, size_t n, char *err, size_t errlen) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return say(err, errlen, "spool write: %s (%lld)", strerror(errno), errno);
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Append to the unit's buffer, flushing it when full; counts the unit's bytes. */
static int emit(chl_unit *u, const void *data, size_t len, char *err, size_t errlen) {
    u->bytes += (int64_t)len;
    if ((size_t)u->used + len > BUF_SIZE) {
        if (flush_all(u->fd, u->buf, (size_t)u->used, err, errlen))
            return -1;
        u->used = 0;
        if (len > BUF_SIZE) /* a value larger than the buffer: straight out */
            return flush_all(u->fd, data, len, err, errlen);
    }
    memcpy(u->buf + u->used, data, len);
    u->used += (int32_t)len;
    return 0;
}

static int put(chl_unit *u, const void *data, size_t len, char *err, size_t errlen) {
    if ((size_t)u->used + len + 1 <= BUF_SIZE) { /* the usual case: one copy */
        memcpy(u->buf + u->used, data, len);
        u->buf[u->used + len] = '\n';
        u->used += (int32_t)(len + 1);
        u->bytes += (int64_t)len + 1;
        return 0;
    }
    return emit(u, data, len, err, errlen) || emit(u, "\n", 1, err, errlen) ? -1 : 0;
}

/* `s` as a JSON string: quotes, backslashes and control bytes escaped, others as
 * they are (the engine's JSON reader takes any bytes in a string). */
static int emit_json_string(chl_unit *u, const unsigned char *s, size_t n, char *err,
                            size_t errlen) {
    char tmp[4096];
    size_t t = 0;
    tmp[t++] = '"';
    for (size_t i = 0; i < n; i++) {
        if (t > sizeof tmp - 8) {
            if (emit(u, tmp, t, err, errlen))
                return -1;
            t = 0;
        }
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            tmp[t++] = '\\';
            tmp[t++] = (char)c;
        } else if (c < 0x20) {
            t += (size_t)snprintf(tmp + t, 7, "\\u%04x", c);
        } else {
            tmp[t++] = (char)c;
        }
    }
    tmp[t++] = '"';
    return emit(u, tmp, t, err, errlen);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* The message's timestamp as `YYYY-MM-DD hh:mm:ss.mmm` (UTC; none: the epoch). */
static int stamp(const rd_kafka_message_t *m, char *out, size_t size) {
    int type = 0;
    long long ms = (long long)rd_kafka_message_timestamp(m, &type);
    if (ms < 0)
        ms = 0;
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    return snprintf(out, size, "%04d-%02d-%02d %02d:%02d:%02d.%03d", tm.tm_year + 1900,
                    tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                    (int)(ms % 1000));
}

/* `s` as a CSV field: quoted, a quote doubled (any other byte as it is). */
static int emit_csv_string(chl_unit *u, const char *s, size_t n, char *err, size_t errlen) {
    if (emit(u, "\"", 1, err, errlen))
        return -1;
    for (const char *q; n && (q = memchr(s, '"', n)) != NULL; n -= (size_t)(q + 1 - s), s = q + 1)
        if (emit(u, s, (size_t)(q + 1 - s), err, errlen) || emit(u, "\"", 1, err, errlen))
            return -1;
    return emit(u, s, n, err, errlen) || emit(u, "\"", 1, err, errlen) ? -1 : 0;
}

/* `s` as a TSV field: backslash, tab, newline, carriage return and NUL escaped. */
static int emit_tsv_string(chl_unit *u, const unsigned char *s, size_t n, char *err,
                           size_t errlen) {
    char tmp[4096];
    size_t t = 0;
    for (size_t i = 0; i < n; i++) {
        if (t > sizeof tmp - 4) {
            if (emit(u, tmp, t, err, errlen))
                return -1;
            t = 0;
        }
        unsigned char c = s[i];
        const char *esc = c == '\\' ? "\\\\" : c == '\t' ? "\\t" : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r" : c == 0 ? "\\0" : NULL;
        if (esc) {
            tmp[t++] = esc[0];
            tmp[t++] = esc[1];
        } else {
            tmp[t++] = (char)c;
        }
    }
    return emit(u, tmp, t, err, errlen);
}

/* --audit, CSV and TSV: the line with the message's metadata as its last five fields,
 * `1,a` -> `1,a,"t",0,7,"2026-11-24 05:00:00.123","k"` (TSV: tab-separated, escaped;
 * no key: empty). A trailing line break of the value is dropped first. */
static int put_audited_line(chl_unit *u, const rd_kafka_message_t *m, char *err,
                            size_t errlen) {
    const char *v = m->payload;
    size_t n = m->len;
    while (n && (v[n - 1] == '\n' || v[n - 1] == '\r'))
        n--;
    int csv = u->audit == AUDIT_CSV;
    char sep = csv ? ',' : '\t';
    char when[64];
    stamp(m, when, sizeof when);
    char mid[160];
    int h = csv ? snprintf(mid, sizeof mid, ",%d,%lld,\"%s\",", (int)u->partition,
                           (long long)m->offset, when)
                : snprintf(mid, sizeof mid, "\t%d\t%lld\t%s\t", (int)u->partition,
                           (long long)m->offset, when);
    const unsigned char *key = m->key ? m->key : (const unsigned char *)"";
    size_t key_len = m->key ? m->key_len : 0;
    if (emit(u, v, n, err, errlen) || emit(u, &sep, 1, err, errlen))
        return -1;
    if (csv ? emit_csv_string(u, u->topic, strlen(u->topic), err, errlen)
            : emit_tsv_string(u, (const unsigned char *)u->topic, strlen(u->topic), err, errlen))
        return -1;
    if (emit(u, mid, (size_t)h, err, errlen))
        return -1;
    if (csv ? emit_csv_string(u, (const char *)key, key_len, err, errlen)
            : emit_tsv_string(u, key, key_len, err, errlen))
        return -1;
    return emit(u, "\n", 1, err, errlen);
}

/* --audit: a JSON object's value with the message's metadata as its last fields,
 * `{"id":1}` -> `{"id":1,"_topic":"t","_partition":0,"_offset":7,
 * "_timestamp":"2026-11-24 05:00:00.123","_key":"k"}` (UTC; no key: ""). A value that
 * is not an object goes as it is: the engine rejects it like any malformed row. */
static int put_audited(chl_unit *u, const rd_kafka_message_t *m, char *err, size_t errlen) {
    const char *v = m->payload;
    size_t n = m->len;
    while (n && is_space(v[n - 1]))
        n--;
    if (!n || v[n - 1] != '}')
        return put(u, m->payload, m->len, err, errlen);
    size_t k = n - 1;
    while (k && is_space(v[k - 1]))
        k--;
    int empty = k && v[k - 1] == '{';
    char when[64];
    stamp(m, when, sizeof when);
    char head[256];
    int h = snprintf(head, sizeof head, "%s\"_topic\":", empty ? "" : ",");
    if (emit(u, v, k, err, errlen) || emit(u, head, (size_t)h, err, errlen) ||
        emit_json_string(u, (const unsigned char *)u->topic, strlen(u->topic), err, errlen))
        return -1;
    h = snprintf(head, sizeof head, ",\"_partition\":%d,\"_offset\":%lld,\"_timestamp\":"
                 "\"%s\",\"_key\":", (int)u->partition, (long long)m->offset, when);
    if (emit(u, head, (size_t)h, err, errlen) ||
        emit_json_string(u, m->key, m->key ? m->key_len : 0, err, errlen))
        return -1;
    return emit(u, "}\n", 2, err, errlen);
}

static chl_unit *unit_of(chl_unit *units, int n, const rd_kafka_message_t *m) {
    for (int i = 0; i < n; i++) {
        chl_unit *u = &units[i];
        if (u->partition != m->partition)
            continue;
        if (u->rkt == m->rkt)
            return u;
        if (!u->rkt && m->rkt && strcmp(rd_kafka_topic_name(m->rkt), u->topic) == 0) {
            u->rkt = m->rkt;
            return u;
        }
    }
    return NULL;
}

/* One message of a unit: 1 when the unit is complete, 0 to go on, -1 on an error. */
static int take(chl_unit *u, const rd_kafka_message_t *m, char *err, size_t errlen) {
    if (m->err == ERR_PARTITION_EOF) {
        if (m->offset > u->expect)
            u->expect = m->offset;
        return u->expect > u->last;
    }
    if (m->err) {
        char detail[512];
        snprintf(detail, sizeof detail, "%.*s", m->payload ? (int)m->len : 0,
                 m->payload ? (const char *)m->payload : "");
        snprintf(err, errlen, "kafka %s/%d at offset %lld...%lld: %s", u->topic,
                 (int)u->partition, (long long)u->first, (long long)u->last,
                 detail[0] ? detail : rd_kafka_err2str(m->err));
        return -1;
    }
    if (m->offset > u->last)
        return 1;
    if (m->offset < u->expect) /* a re-delivery after a fetch reset: already written */
        return 0;
    if (m->offset != u->expect)
        u->contiguous = 0;
    if (u->first_offset < 0)
        u->first_offset = m->offset;
    u->expect = m->offset + 1;
    if (!m->payload) {
        u->contiguous = 0; /* a tombstone: no row */
    } else {
        int rc = !u->audit                ? put(u, m->payload, m->len, err, errlen)
                 : u->audit == AUDIT_JSON ? put_audited(u, m, err, errlen)
                                          : put_audited_line(u, m, err, errlen);
        if (rc)
            return -1;
        u->messages++;
    }
    return u->expect > u->last;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static int consume(rd_kafka_t *rk, chl_unit *units, int n, int timeout_ms, char *err,
                   size_t errlen) {
    rd_kafka_queue_t *queue = rd_kafka_queue_get_consumer(rk);
    rd_kafka_message_t **batch = malloc(sizeof *batch * BATCH);
    int pending = 0, rc = 0;
    for (int i = 0; i < n; i++)
        pending += !units[i].done;
    double quiet = now();
    while (pending > 0 && rc == 0) {
        ssize_t got = rd_kafka_consume_batch_queue(queue, 200, batch, BATCH);
        if (got < 0) {
            rc = say(err, errlen, "kafka %s: consume failed (%lld)", units[0].topic, (long long)got);
            break;
        }
        if (got == 0 && now() - quiet > timeout_ms / 1000.0) {
            for (int i = 0; i < n; i++)
                if (!units[i].done)
                    snprintf(err, errlen, "kafka %s/%d: no message at offset %lld for %d s "
                             "(offsets up to %lld were there at start); run again later",
                             units[i].topic, (int)units[i].partition, (long long)units[i].expect,
                             timeout_ms / 1000, (long long)units[i].last);
            rc = -1;
            break;
        }
        if (got > 0)
            quiet = now();
        for (ssize_t i = 0; i < got; i++) {
            chl_unit *u = rc ? NULL : unit_of(units, n, batch[i]);
            if (u && !u->done) {
                int r = take(u, batch[i], err, errlen);
                if (r < 0)
                    rc = -1;
                else if (r > 0) {
                    u->done = 1;
                    pending--;
                }
            }
            rd_kafka_message_destroy(batch[i]);
        }
    }
    free(batch);
    rd_kafka_queue_destroy(queue);
    return rc;
}

int chl_read(rd_kafka_t *rk, chl_unit *units, int n, int timeout_ms, char *err,
             size_t errlen) {
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(n);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        chl_unit *u = &units[i];
        u->contiguous = 1;
        u->messages = u->bytes = 0;
        u->first_offset = -1;
        u->expect = u->first;
        u->done = u->first > u->last;
        u->used = 0;
        u->rkt = NULL;
        u->buf = malloc(BUF_SIZE);
        rd_kafka_topic_partition_list_add(parts, u->topic, u->partition)->offset = u->first;
    }
    int e = rd_kafka_assign(rk, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    if (e) {
        snprintf(err, errlen, "kafka %s: assign: %s", units[0].topic, rd_kafka_err2str(e));
        rc = -1;
    }
    if (rc == 0)
        rc = consume(rk, units, n, timeout_ms, err, errlen);
    rd_kafka_assign(rk, NULL);
    for (int i = 0; i < n; i++) {
        chl_unit *u = &units[i];
        if (rc == 0 && u->used && flush_all(u->fd, u->buf, (size_t)u->used, err, errlen))
            rc = -1;
        free(u->buf);
        u->buf = NULL;
        u->rkt = NULL;
    }
    return rc;
}
