/* chload's native MySQL/MariaDB range reader (mysql_native.py builds and binds it).
 *
 * Why: the `mariadb` client cannot mark NULL apart from the string 'NULL' while
 * escaping tabs and newlines, so the server had to escape every text field in SQL
 * (IF/RLIKE/REPLACE, a real cost to the database), and a Python thread
 * relayed the client's output to find where a range ends. Here the rows come over
 * libmariadb's text protocol (the client's own library, mysql_use_result: row by row,
 * nothing held) and are written as ClickHouse TSV (backslash escapes, \N for NULL)
 * straight into the file descriptor the engine reads. No row passes through Python:
 * ctypes releases the GIL for the whole range.
 *
 * Built against the system's libmariadb.so.3 without its headers (libmariadb-dev is
 * often absent): the few calls below are declared here, with the C ABI that
 * Connector/C and libmysqlclient share.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct st_mysql MYSQL;
typedef struct st_mysql_res MYSQL_RES;
typedef char **MYSQL_ROW;

extern MYSQL *mysql_init(MYSQL *);
extern int mysql_options(MYSQL *, int option, const void *arg);
extern MYSQL *mysql_real_connect(MYSQL *, const char *host, const char *user,
                                 const char *passwd, const char *db, unsigned int port,
                                 const char *unix_socket, unsigned long flags);
extern int mysql_set_character_set(MYSQL *, const char *csname);
extern int mysql_real_query(MYSQL *, const char *q, unsigned long length);
extern MYSQL_RES *mysql_use_result(MYSQL *);
extern MYSQL_RES *mysql_store_result(MYSQL *);
extern unsigned int mysql_field_count(MYSQL *);
extern unsigned int mysql_num_fields(MYSQL_RES *);
extern MYSQL_ROW mysql_fetch_row(MYSQL_RES *);
extern unsigned long *mysql_fetch_lengths(MYSQL_RES *);
extern void mysql_free_result(MYSQL_RES *);
extern unsigned int mysql_errno(MYSQL *);
extern const char *mysql_error(MYSQL *);
extern int mysql_get_socket(MYSQL *);
extern void mysql_close(MYSQL *);

enum { OPT_CONNECT_TIMEOUT = 0, OPT_PROTOCOL = 9, PROTOCOL_TCP = 1 };
enum { BUF = 1 << 20, WRITE_FAILED = -1, ZERO_DATE = -2, OUT_OF_RANGE = -3 };

static void say(MYSQL *m, char *err, size_t errlen) {
    snprintf(err, errlen, "%s", m ? mysql_error(m) : "out of memory");
}

/* A connection over TCP in utf8mb4, or NULL with the error number in *code and why
 * in err. */
MYSQL *chl_my_open(const char *host, unsigned int port, const char *user,
                   const char *password, const char *db, unsigned int timeout,
                   int *code, char *err, size_t errlen) {
    MYSQL *m = mysql_init(NULL);
    unsigned int tcp = PROTOCOL_TCP;
    *code = 0;
    if (!m) {
        say(NULL, err, errlen);
        return NULL;
    }
    mysql_options(m, OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(m, OPT_PROTOCOL, &tcp);
    if (!mysql_real_connect(m, host, user, password, db, port, NULL, 0) ||
        mysql_set_character_set(m, "utf8mb4")) {
        say(m, err, errlen);
        *code = (int)mysql_errno(m);
        mysql_close(m);
        return NULL;
    }
    return m;
}

/* Run one statement, discarding any rows; 0, else the error number (err says it). */
int chl_my_exec(MYSQL *m, const char *sql, char *err, size_t errlen) {
    if (mysql_real_query(m, sql, (unsigned long)strlen(sql))) {
        say(m, err, errlen);
        return (int)mysql_errno(m);
    }
    MYSQL_RES *res = mysql_store_result(m);
    if (res) {
        mysql_free_result(res);
    } else if (mysql_field_count(m)) {
        say(m, err, errlen);
        return (int)mysql_errno(m);
    }
    return 0;
}

static int flush(int fd, const char *buf, size_t used) {
    while (used) {
        ssize_t n = write(fd, buf, used);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += n;
        used -= (size_t)n;
    }
    return 0;
}

/* One field, escaped as ClickHouse TSV reads it, into buf (room for 2x its length). */
static size_t escape(char *out, const char *s, unsigned long len) {
    char *o = out;
    for (unsigned long i = 0; i < len; i++) {
        char c = s[i];
        switch (c) {
        case '\\': *o++ = '\\'; *o++ = '\\'; break;
        case '\t': *o++ = '\\'; *o++ = 't'; break;
        case '\n': *o++ = '\\'; *o++ = 'n'; break;
        case '\r': *o++ = '\\'; *o++ = 'r'; break;
        case '\0': *o++ = '\\'; *o++ = '0'; break;
        default: *o++ = c;
        }
    }
    return (size_t)(o - out);
}

/* A date or datetime with a zero month or day ('0000-00-00', '2024-02-00'): MySQL
 * keeps them under a permissive sql_mode; ClickHouse reads each as another date,
 * silently (1900-01-01, 2026-01-01), so they are never passed on as they are. */
static int zero_date(const char *s, unsigned long len) {
    return len >= 10 && ((s[5] == '0' && s[6] == '0') || (s[8] == '0' && s[9] == '0'));
}

/* What a field is checked for (chl_my_copy's `checks`): its zero dates ('1' fail the
 * range with ZERO_DATE, '2' are NULL, '0' nothing) and, where lo is not empty, its
 * range: a date or time outside [lo, hi] (compared as text, over the shorter of the two:
 * MySQL prints years with 4 digits) is a value the target's type cannot hold. */
typedef struct {
    char zero;
    const char *lo, *hi;
    size_t lolen, hilen;
} check_t;

static const char SHOWN[] = "out of range: "; /* db_range.SHOWN */

static int outside(const char *s, unsigned long len, const check_t *c) {
    if (!c->lolen) return 0;
    size_t n = len < c->lolen ? len : c->lolen;
    if (memcmp(s, c->lo, n) < 0) return 1;
    n = len < c->hilen ? len : c->hilen;
    return memcmp(s, c->hi, n) > 0;
}

/* `checks`: "F" (a value out of range fails the range: OUT_OF_RANGE, err says the
 * field's index and the value) or "S" (it is written after SHOWN, which no date parser
 * takes: the engine rejects the row, within an error budget), then per field
 * "<zero><lo>\t<hi>\n". NULL: nothing is checked. */
static int parse_checks(const char *spec, unsigned int fields, check_t *out, char *mode) {
    const char *p = spec + 1;
    *mode = spec[0];
    for (unsigned int f = 0; f < fields; f++) {
        const char *tab, *end;
        if (!*p || !(tab = strchr(p + 1, '\t')) || !(end = strchr(tab, '\n'))) return -1;
        out[f].zero = *p;
        out[f].lo = p + 1;
        out[f].lolen = (size_t)(tab - p - 1);
        out[f].hi = tab + 1;
        out[f].hilen = (size_t)(end - tab - 1);
        p = end + 1;
    }
    return 0;
}

static int put_row(int fd, char *buf, size_t *used, MYSQL_ROW row, unsigned long *lens,
                   unsigned int fields, const check_t *checks, char mode, char *err,
                   size_t errlen) {
    for (unsigned int f = 0; f < fields; f++) {
        const check_t *c = checks ? &checks[f] : NULL;
        int shown = 0;
        if (c && c->zero > '0' && row[f] && zero_date(row[f], lens[f])) {
            if (c->zero == '1') {
                snprintf(err, errlen, "%u\t%.*s", f, (int)(lens[f] < 64 ? lens[f] : 64),
                         row[f]);
                return ZERO_DATE;
            }
            row[f] = NULL;
        }
        if (c && row[f] && outside(row[f], lens[f], c)) {
            if (mode == 'F') {
                snprintf(err, errlen, "%u\t%.*s", f, (int)(lens[f] < 64 ? lens[f] : 64),
                         row[f]);
                return OUT_OF_RANGE;
            }
            shown = (int)sizeof SHOWN - 1;
        }
        size_t need = row[f] ? 2 * (size_t)lens[f] + 1 + (size_t)shown : 3;
        if (*used + need > BUF) {
            if (flush(fd, buf, *used)) return WRITE_FAILED;
            *used = 0;
        }
        if (shown) {
            memcpy(buf + *used, SHOWN, (size_t)shown);
            *used += (size_t)shown;
        }
        if (need > BUF) { /* a field larger than the buffer: escaped in pieces */
            char piece[4096];
            if (*used && flush(fd, buf, *used)) return WRITE_FAILED; /* (SHOWN first) */
            *used = 0;
            for (unsigned long at = 0; at < lens[f]; at += sizeof piece / 2) {
                unsigned long n = lens[f] - at < sizeof piece / 2 ? lens[f] - at
                                                                   : sizeof piece / 2;
                if (flush(fd, piece, escape(piece, row[f] + at, n))) return WRITE_FAILED;
            }
        } else if (row[f]) {
            *used += escape(buf + *used, row[f], lens[f]);
        } else {
            buf[(*used)++] = '\\';
            buf[(*used)++] = 'N';
        }
        buf[(*used)++] = f + 1 == fields ? '\n' : '\t';
    }
    return 0;
}

/* The rows of `sql` as TSV into fd (not closed). 0 when every row was written;
 * WRITE_FAILED when fd refused (err says why); ZERO_DATE or OUT_OF_RANGE (put_row,
 * `checks`: parse_checks); else the server's or the connection's error number. `rows`
 * counts the rows written. The connection is usable after 0 only. */
int chl_my_copy(MYSQL *m, const char *sql, int fd, const char *checks, long long *rows,
                char *err, size_t errlen) {
    static __thread char buf[BUF];
    size_t used = 0;
    *rows = 0;
    if (mysql_real_query(m, sql, (unsigned long)strlen(sql))) {
        say(m, err, errlen);
        return (int)mysql_errno(m);
    }
    MYSQL_RES *res = mysql_use_result(m);
    if (!res) {
        say(m, err, errlen);
        return (int)mysql_errno(m);
    }
    unsigned int fields = mysql_num_fields(res);
    check_t *check = NULL;
    char mode = 'F';
    if (checks && (!(check = calloc(fields, sizeof *check)) ||
                   parse_checks(checks, fields, check, &mode))) {
        free(check);
        snprintf(err, errlen, "the range checks do not match the %u columns", fields);
        return WRITE_FAILED;
    }
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res)) != NULL) {
        int put = put_row(fd, buf, &used, row, mysql_fetch_lengths(res), fields, check,
                          mode, err, errlen);
        if (put == ZERO_DATE || put == OUT_OF_RANGE) {
            free(check);
            return put; /* (the result is left unread, as below) */
        }
        if (put) {
            snprintf(err, errlen, "writing the range: %s", strerror(errno));
            free(check);
            return WRITE_FAILED; /* the result is left unread: the caller closes */
        }
        (*rows)++;
    }
    free(check);
    if (mysql_errno(m)) {
        say(m, err, errlen);
        int code = (int)mysql_errno(m);
        mysql_free_result(res);
        return code;
    }
    mysql_free_result(res);
    if (flush(fd, buf, used)) {
        snprintf(err, errlen, "writing the range: %s", strerror(errno));
        return WRITE_FAILED;
    }
    return 0;
}

/* The rows of a small statement (the session's own questions: columns, keys, bounds)
 * as TSV in a malloc'd buffer (*out, *len; chl_my_free it); 0, else the error number. */
int chl_my_rows(MYSQL *m, const char *sql, char **out, size_t *len, char *err,
                size_t errlen) {
    *out = NULL;
    *len = 0;
    if (mysql_real_query(m, sql, (unsigned long)strlen(sql))) {
        say(m, err, errlen);
        return (int)mysql_errno(m);
    }
    MYSQL_RES *res = mysql_store_result(m);
    if (!res) {
        if (!mysql_field_count(m)) return 0; /* a statement without rows */
        say(m, err, errlen);
        return (int)mysql_errno(m);
    }
    unsigned int fields = mysql_num_fields(res);
    size_t cap = 4096, used = 0;
    char *buf = malloc(cap);
    MYSQL_ROW row;
    while (buf && (row = mysql_fetch_row(res)) != NULL) {
        unsigned long *lens = mysql_fetch_lengths(res);
        size_t need = fields; /* separators */
        for (unsigned int f = 0; f < fields; f++) need += row[f] ? 2 * lens[f] : 2;
        if (used + need > cap) {
            while (used + need > cap) cap *= 2;
            char *more = realloc(buf, cap);
            if (!more) free(buf);
            buf = more;
            if (!buf) break;
        }
        for (unsigned int f = 0; f < fields; f++) {
            if (row[f]) {
                used += escape(buf + used, row[f], lens[f]);
            } else {
                buf[used++] = '\\';
                buf[used++] = 'N';
            }
            buf[used++] = f + 1 == fields ? '\n' : '\t';
        }
    }
    mysql_free_result(res);
    if (!buf) {
        say(NULL, err, errlen);
        return WRITE_FAILED;
    }
    *out = buf;
    *len = used;
    return 0;
}

void chl_my_free(char *buf) { free(buf); }

/* From another thread: make a blocked read or write on the connection fail now. */
void chl_my_abort(MYSQL *m) {
    int s = mysql_get_socket(m);
    if (s >= 0) shutdown(s, SHUT_RDWR);
}

void chl_my_close(MYSQL *m) { mysql_close(m); }
