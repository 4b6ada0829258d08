/* The local walk's inner loops (sources/files/walk.py): a directory's entries, sorted,
 * and which of its files a table's ledger holds as they are now.
 *
 * A rerun over a long history lists every file again (a rewritten file keeps its
 * directory's mtime), so each known file must cost a readdir entry and a stat, not a
 * Python object: `chload_known` stats a run of names and compares each file's keys
 * with the ledger's (commit/known.py: the first 8 bytes of MD5 of the uri and of the
 * identity `size:mtime_ns`, little-endian), marking those it skips. Everything else
 * (a new or changed file, a link, a name not ASCII) is left to Python, which decides
 * as it always did.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- MD5 (RFC 1321), only as much as short keys need ---- */

static const uint32_t K[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613,
    0xfd469501, 0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193,
    0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d,
    0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
    0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122,
    0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa,
    0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244,
    0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb,
    0xeb86d391};

#define ROTL(x, c) (((x) << (c)) | ((x) >> (32 - (c))))
#define STEP(f, a, b, c, d, x, k, s) (a) = (b) + ROTL((a) + f((b), (c), (d)) + (x) + (k), (s))
#define F(x, y, z) ((z) ^ ((x) & ((y) ^ (z))))
#define G(x, y, z) ((y) ^ ((z) & ((x) ^ (y))))
#define H(x, y, z) ((x) ^ (y) ^ (z))
#define I(x, y, z) ((y) ^ ((x) | ~(z)))

static void md5_block(uint32_t h[4], const uint8_t *p) {
    uint32_t m[16], a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 16; i++)
        m[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
               (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
    for (int i = 0; i < 16; i += 4) {
        STEP(F, a, b, c, d, m[i], K[i], 7);
        STEP(F, d, a, b, c, m[i + 1], K[i + 1], 12);
        STEP(F, c, d, a, b, m[i + 2], K[i + 2], 17);
        STEP(F, b, c, d, a, m[i + 3], K[i + 3], 22);
    }
    for (int i = 16; i < 32; i += 4) {
        STEP(G, a, b, c, d, m[(5 * i + 1) % 16], K[i], 5);
        STEP(G, d, a, b, c, m[(5 * i + 6) % 16], K[i + 1], 9);
        STEP(G, c, d, a, b, m[(5 * i + 11) % 16], K[i + 2], 14);
        STEP(G, b, c, d, a, m[(5 * i + 16) % 16], K[i + 3], 20);
    }
    for (int i = 32; i < 48; i += 4) {
        STEP(H, a, b, c, d, m[(3 * i + 5) % 16], K[i], 4);
        STEP(H, d, a, b, c, m[(3 * i + 8) % 16], K[i + 1], 11);
        STEP(H, c, d, a, b, m[(3 * i + 11) % 16], K[i + 2], 16);
        STEP(H, b, c, d, a, m[(3 * i + 14) % 16], K[i + 3], 23);
    }
    for (int i = 48; i < 64; i += 4) {
        STEP(I, a, b, c, d, m[(7 * i) % 16], K[i], 6);
        STEP(I, d, a, b, c, m[(7 * i + 7) % 16], K[i + 1], 10);
        STEP(I, c, d, a, b, m[(7 * i + 14) % 16], K[i + 2], 15);
        STEP(I, b, c, d, a, m[(7 * i + 21) % 16], K[i + 3], 21);
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
}

/* reinterpretAsUInt64(MD5(text)): the digest's first 8 bytes, little-endian. */
static uint64_t md5_key(const char *text, size_t n) {
    uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
    uint8_t tail[128];
    size_t whole = n - n % 64;
    for (size_t i = 0; i < whole; i += 64) md5_block(h, (const uint8_t *)text + i);
    size_t rest = n - whole, len = rest + 9 <= 64 ? 64 : 128;
    memset(tail, 0, len);
    memcpy(tail, text + whole, rest);
    tail[rest] = 0x80;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[len - 8 + i] = (uint8_t)(bits >> (8 * i));
    md5_block(h, tail);
    if (len == 128) md5_block(h, tail + 64);
    return (uint64_t)h[0] | (uint64_t)h[1] << 32;
}

uint64_t chload_md5_key(const char *text, size_t n) { return md5_key(text, n); }

/* ---- a directory's entries ---- */

typedef struct { char *key; int dir; } entry;  /* key: the name, "name/" for a directory */

static int by_key(const void *a, const void *b) {
    return strcmp(((const entry *)a)->key, ((const entry *)b)->key);
}

static int is_dir(int dirfd, const struct dirent *e) {
    if (e->d_type == DT_DIR) return 1;
    if (e->d_type != DT_UNKNOWN && e->d_type != DT_LNK) return 0;
    struct stat st;  /* a link to a directory is walked (walks follow them) */
    return fstatat(dirfd, e->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
}

/* The directory's entries that are not hidden, sorted as the walk visits them (a
 * directory's name as "name/"), into `out` as "name\0" each, and into `types` a byte
 * each ('d' a directory, 'f' anything else). Returns the bytes written to `out`, -1 if
 * the directory holds `lock` (a chload target: never walked), -2 if it cannot be read,
 * or -(bytes needed) - 2 when `out` or `types` is too small. */
long chload_entries(int dirfd, const char *lock, char *out, long cap, char *types,
                    long types_cap) {
    int fd = dup(dirfd);
    DIR *dir = fd < 0 ? NULL : fdopendir(fd);
    if (!dir) {
        if (fd >= 0) close(fd);
        return -2;
    }
    rewinddir(dir);  /* (a dup shares its offset: a call again after a short buffer) */
    size_t n = 0, room = 256, bytes = 0;
    entry *all = malloc(room * sizeof(entry));
    long result = 0;
    struct dirent *e;
    while (all && (e = readdir(dir))) {
        if (e->d_name[0] == '.') {
            if (strcmp(e->d_name, lock) == 0) { result = -1; break; }
            continue;
        }
        if (n == room) {
            entry *more = realloc(all, (room *= 2) * sizeof(entry));
            if (!more) { result = -2; break; }
            all = more;
        }
        size_t len = strlen(e->d_name);
        int d = is_dir(dirfd, e);
        char *key = malloc(len + 2);
        if (!key) { result = -2; break; }
        memcpy(key, e->d_name, len);
        key[len] = d ? '/' : '\0';
        key[len + 1] = '\0';
        all[n].key = key;
        all[n++].dir = d;
        bytes += len + 1;
    }
    closedir(dir);
    if (!all) return -2;
    if (result == 0 && ((long)bytes > cap || (long)n > types_cap))
        result = -(long)(bytes > (size_t)n ? bytes : n) - 2;
    if (result == 0) {
        qsort(all, n, sizeof(entry), by_key);
        char *at = out;
        for (size_t i = 0; i < n; i++) {
            size_t len = strlen(all[i].key) - (size_t)all[i].dir;
            memcpy(at, all[i].key, len);
            at[len] = '\0';
            at += len + 1;
            types[i] = all[i].dir ? 'd' : 'f';
        }
        result = (long)(at - out);
    }
    for (size_t i = 0; i < n; i++) free(all[i].key);
    free(all);
    return result;
}

/* ---- which files the ledger holds as they are ---- */

enum { SKIPPED = 0, ASK = 1, NONE = 2 };  /* codes, one a name */

/* `table` for the sorted `keys`: where the keys of each value of their top `bits` bits
 * begin (entry b: the first key whose top bits are b or more; entry 2^bits: n). Made
 * once a walk; a key's lookup then reads one entry of it and bisects a few keys: MD5
 * keys spread evenly, so a bucket holds a handful. */
void chload_buckets(const uint64_t *keys, long n, uint32_t *table, int bits) {
    long size = 1L << bits, i = 0;
    for (long b = 0; b < size; b++) {
        while (i < n && (keys[i] >> (64 - bits)) < (uint64_t)b) i++;
        table[b] = (uint32_t)i;
    }
    table[size] = (uint32_t)n;
}

/* The index of `key` in the sorted `keys[lo, hi)`, or -1. */
static long find(const uint64_t *keys, long lo, long hi, uint64_t key) {
    long end = hi;
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (keys[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo < end && keys[lo] == key ? lo : -1;
}

/* `value` in decimal at `out`; returns the characters written (at most 20). */
static int decimal(char *out, long long value) {
    char digits[24];
    int n = 0, at = 0;
    unsigned long long v = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do { digits[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    if (value < 0) out[at++] = '-';
    while (n) out[at++] = digits[--n];
    return at;
}

/* `names` ("name\0" each, `count` of them) in the directory `dirfd`, whose uris are
 * `prefix` + name: each one's code into `codes`. SKIPPED: a regular file the ledger
 * holds with this size and mtime (`uris`, sorted, their chload_buckets `table` of
 * `bits`, and `identities` beside them; its mark in `met` set); NONE: gone, or not a
 * regular file (a walk passes it by); ASK: anything else (new, changed, met already,
 * a link, a name not ASCII), for Python to decide. Returns how many were SKIPPED. */
long chload_known(int dirfd, const char *names, long count, const char *prefix,
                  long prefix_len, const uint64_t *uris, const uint64_t *identities,
                  uint8_t *met, const uint32_t *table, int bits, uint8_t *codes) {
    char uri[8192];
    long skipped = 0;
    const char *name = names;
    size_t room = prefix_len < (long)sizeof uri ? sizeof uri - (size_t)prefix_len : 0;
    if (room) memcpy(uri, prefix, (size_t)prefix_len);
    /* Each file's keys are looked up in memory far larger than the caches: the lines a
     * lookup reads are asked for (prefetched) as early as what they depend on is known,
     * so they arrive while the kernel stats the file and the identity's MD5 is made. */
    for (long i = 0; i < count; i++, name += strlen(name) + 1) {
        size_t len = strlen(name);
        int ascii = 1;
        for (size_t j = 0; j < len; j++) ascii &= (unsigned char)name[j] < 0x80;
        int plain = ascii && len < room;  /* (else Python decides) */
        uint64_t key = 0, bucket = 0;
        if (plain) {
            memcpy(uri + prefix_len, name, len);
            key = md5_key(uri, (size_t)prefix_len + len);
            bucket = key >> (64 - bits);
            __builtin_prefetch(table + bucket);
        }
        struct stat st;
        if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) { codes[i] = NONE; continue; }
        if (S_ISLNK(st.st_mode) || !plain) { codes[i] = ASK; continue; }
        if (!S_ISREG(st.st_mode)) { codes[i] = NONE; continue; }
        long lo = table[bucket], hi = table[bucket + 1];
        if (lo < hi) {
            __builtin_prefetch(uris + lo);
            __builtin_prefetch(identities + lo);
            __builtin_prefetch(met + lo);
        }
        char identity[48];  /* "size:mtime_ns", as Python writes it */
        int n = decimal(identity, (long long)st.st_size);
        identity[n++] = ':';
        n += decimal(identity + n, (long long)st.st_mtim.tv_sec * 1000000000LL +
                                   st.st_mtim.tv_nsec);
        uint64_t same = md5_key(identity, (size_t)n);
        long at = find(uris, lo, hi, key);
        if (at < 0 || met[at] || identities[at] != same) { codes[i] = ASK; continue; }
        met[at] = 1;
        codes[i] = SKIPPED;
        skipped++;
    }
    return skipped;
}

/* ---- a first listing: each file's stat and start ---- */

enum { FOUND = 3 };

/* `names` ("name\0" each, `count` of them) in the directory `dirfd`: each one's code
 * into `codes`. FOUND: a regular file, its size and mtime (ns) into `sizes` and `mtimes`
 * and, when it holds at most `limit` bytes, all of them at `starts + i * limit`, their
 * count into `lens` (-1: larger, or not read); NONE: gone, or not a regular file; ASK:
 * a link, a name not ASCII or holding a character the engine's file() expands (`*?{}`),
 * for Python to describe. Returns how many were FOUND. */
long chload_described(int dirfd, const char *names, long count, long limit,
                      int64_t *sizes, int64_t *mtimes, int32_t *lens, uint8_t *codes,
                      char *starts) {
    long found = 0;
    const char *name = names;
    for (long i = 0; i < count; i++, name += strlen(name) + 1) {
        int plain = 1;
        for (const char *c = name; *c; c++)
            plain &= (unsigned char)*c < 0x80 && *c != '*' && *c != '?' && *c != '{' &&
                     *c != '}';
        lens[i] = -1;
        struct stat st;
        if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) { codes[i] = NONE; continue; }
        if (S_ISLNK(st.st_mode) || !plain) { codes[i] = ASK; continue; }
        if (!S_ISREG(st.st_mode)) { codes[i] = NONE; continue; }
        codes[i] = FOUND;
        found++;
        sizes[i] = (int64_t)st.st_size;
        mtimes[i] = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        if (st.st_size > limit) continue;
        int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        char *at = starts + i * limit;
        long got = 0;
        while (got < limit) {  /* (to its end: a file may have grown since the stat) */
            ssize_t n = read(fd, at + got, (size_t)(limit - got));
            if (n <= 0) { if (n < 0) got = -1; break; }
            got += n;
        }
        close(fd);
        lens[i] = (int32_t)got;
    }
    return found;
}
