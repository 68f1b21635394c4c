/* safetensors.c - safetensors files: a validating reader that bounds what a
 * header can make kiln allocate, and an atomic writer (temp file
 * PATH.tmp.PID.XXXXXX in the same directory, fsync, rename) whose temp
 * files an interrupted run leaves are swept by the next (rt_tmp_sweep). */
#include "train.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *st_names[DT__COUNT] = {
    [DT_F32] = "F32", [DT_BF16] = "BF16", [DT_F16] = "F16",
    [DT_I32] = "I32", [DT_I64] = "I64",   [DT_U8] = "U8",
};

const char *rt_st_dtype_name(DType t)
{
    return st_names[t];
}

static int st_dtype_parse(const char *s)
{
    for (int i = 0; i < DT__COUNT; i++)
        if (strcmp(st_names[i], s) == 0)
            return i;
    return -1;
}

void rt_st_free(StFile *f)
{
    for (int i = 0; i < f->n; i++) {
        free(f->t[i].name);
        free(f->t[i].data);
    }
    for (int i = 0; i < f->nmeta; i++) {
        free(f->key[i]);
        free(f->val[i]);
    }
    free(f->t);
    free(f->key);
    free(f->val);
    memset(f, 0, sizeof *f);
}

const StTensor *rt_st_find(const StFile *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    return NULL;
}

const char *rt_st_meta(const StFile *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->key[i], key) == 0)
            return f->val[i];
    return NULL;
}

/* What a header may make kiln allocate. The header cap is the safetensors
 * format's own (the reference reader refuses more); the JSON value cap
 * bounds what cJSON builds from it (about 64 bytes a value) well above any
 * real file (a tensor entry is at most 15 values). */
#define ST_MAX_HEADER 100000000ull
#define ST_MAX_VALUES (1 << 21)
#define ST_MAX_TENSORS 65536
#define ST_MAX_META 65536
#define ST_MAX_NAME 4096
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53: doubles hold every integer below */

typedef struct {
    uint64_t begin, end;
    const char *name;
} Span;

static int span_cmp(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A name from the file, quoted for a message: at most 64 bytes, anything
 * not printable ASCII as '?' (a hostile name must not drive the terminal). */
static const char *show(const char *s, char out[80])
{
    size_t n = 0;
    for (; s[n] && n < 64; n++)
        out[n] = s[n] >= 0x20 && s[n] < 0x7f ? s[n] : '?';
    if (s[n])
        out[n++] = '.', out[n++] = '.', out[n++] = '.';
    out[n] = 0;
    return out;
}

/* An upper bound on the JSON values in s[0..n): every value but the root
 * follows an opening bracket or a comma outside a string. */
static size_t json_values_bound(const char *s, size_t n)
{
    size_t v = 1;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == ',' || c == '[' || c == '{') {
            v++;
        }
    }
    return v;
}

/* v in decimal; UINT64_MAX (a saturated product) as "over 2^64" */
static const char *u64_str(uint64_t v, char out[32])
{
    if (v == UINT64_MAX)
        snprintf(out, 32, "over 2^64");
    else
        snprintf(out, 32, "%llu", (unsigned long long)v);
    return out;
}

/* Parses one tensor entry into t (data not yet read); [begin, end) is its
 * span of the data section (dlen bytes), checked against dtype x shape and
 * against dlen. */
static bool parse_entry(const char *path, const cJSON *e, StTensor *t, uint64_t dlen,
                        uint64_t *begin, uint64_t *end, Diag *d)
{
    char nm[80];
    show(e->string, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) ||
        !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors header: tensor \"%s\" (expected an object with "
                 "dtype, shape and data_offsets [begin, end])",
                 path, nm);
        return false;
    }
    int dtype = st_dtype_parse(dt->valuestring);
    if (dtype < 0) {
        char got[80];
        snprintf(d->msg, sizeof d->msg,
                 "%s: tensor \"%s\" has unsupported dtype (expected F32, BF16, F16, I32, I64 "
                 "or U8, got %s)",
                 path, nm, show(dt->valuestring, got));
        return false;
    }
    int rank = cJSON_GetArraySize(sh);
    if (rank > IR_MAX_RANK) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: tensor \"%s\" has too many dimensions (expected at most %d, got %d)",
                 path, nm, IR_MAX_RANK, rank);
        return false;
    }
    t->dtype = (DType)dtype;
    t->rank = rank;
    /* numel saturates at UINT64_MAX on overflow: then it matches no span */
    uint64_t numel = 1;
    bool zero = false;
    for (int i = 0; i < rank; i++) {
        const cJSON *x = cJSON_GetArrayItem(sh, i);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble >= ST_MAX_EXACT ||
            x->valuedouble != (double)(int64_t)x->valuedouble) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: tensor \"%s\" has a bad shape (expected non-negative integers below "
                     "2^53, dim %d is not one)",
                     path, nm, i);
            return false;
        }
        t->dim[i] = (int64_t)x->valuedouble;
        zero |= t->dim[i] == 0;
        if (numel != UINT64_MAX && __builtin_mul_overflow(numel, (uint64_t)t->dim[i], &numel))
            numel = UINT64_MAX;
    }
    if (zero)
        numel = 0;
    uint64_t o[2];
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(off, i);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble >= ST_MAX_EXACT ||
            x->valuedouble != (double)(int64_t)x->valuedouble) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: tensor \"%s\" has bad data_offsets (expected non-negative integers "
                     "below 2^53)",
                     path, nm);
            return false;
        }
        o[i] = (uint64_t)x->valuedouble;
    }
    *begin = o[0];
    *end = o[1];
    uint64_t want;
    if (__builtin_mul_overflow(numel, (uint64_t)dtype_size(t->dtype), &want))
        want = UINT64_MAX;
    if (*end < *begin || *end - *begin != want) {
        char wants[32], numels[32];
        u64_str(want, wants);
        u64_str(numel, numels);
        snprintf(d->msg, sizeof d->msg,
                 "%s: tensor \"%s\": data_offsets [%llu, %llu] do not match its dtype and "
                 "shape (expected %s bytes for %s x %s elements, got %s%llu)",
                 path, nm, (unsigned long long)*begin, (unsigned long long)*end, wants,
                 st_names[t->dtype], numels, *end < *begin ? "-" : "",
                 (unsigned long long)(*end < *begin ? *begin - *end : *end - *begin));
        return false;
    }
    if (*end > dlen) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors file: tensor \"%s\" data_offsets [%llu, %llu] "
                 "out of range (expected at most the data section's %llu bytes)",
                 path, nm, (unsigned long long)*begin, (unsigned long long)*end,
                 (unsigned long long)dlen);
        return false;
    }
    t->nbytes = (size_t)want;
    return true;
}
/* Reads n bytes at off; false on an error or a short read. */
static bool read_at(int fd, void *p, size_t n, uint64_t off)
{
    uint8_t *c = p;
    while (n > 0) {
        ssize_t k = pread(fd, c, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        c += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return true;
}

/* Sorts the n names and reports the first one that appears twice; what
 * names them in the message (NULL: the header's top-level keys). */
static bool unique_names(const char *path, const char *what, const char **nm, int n, Diag *d)
{
    qsort(nm, (size_t)n, sizeof *nm, str_cmp);
    for (int i = 1; i < n; i++)
        if (strcmp(nm[i - 1], nm[i]) == 0) {
            char s[80];
            snprintf(d->msg, sizeof d->msg,
                     "%s: corrupt safetensors header: %s \"%s\" appears twice (expected each "
                     "once)",
                     path,
                     what                                    ? what
                     : strcmp(nm[i], "__metadata__") == 0 ? "key"
                                                             : "tensor",
                     show(nm[i], s));
            return false;
        }
    return true;
}

/* The header's __metadata__ object: at most ST_MAX_META distinct keys, each
 * value a string; copied into f. */
static bool read_meta(const char *path, const cJSON *e, StFile *f, Diag *d)
{
    if (!cJSON_IsObject(e)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors header: __metadata__ is not an object (expected "
                 "{\"key\": \"value\", ...})",
                 path);
        return false;
    }
    int m = cJSON_GetArraySize(e);
    if (m > ST_MAX_META) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors header: __metadata__ has %d entries (expected at "
                 "most %d)",
                 path, m, ST_MAX_META);
        return false;
    }
    const char **keys = xcalloc((size_t)m + 1, sizeof *keys);
    const cJSON *kv;
    int k = 0;
    bool ok = true;
    cJSON_ArrayForEach(kv, e)
    {
        char s[80];
        if (!cJSON_IsString(kv)) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: corrupt safetensors header: __metadata__ value \"%s\" is not a "
                     "string",
                     path, show(kv->string, s));
            ok = false;
            break;
        }
        if (strlen(kv->string) > ST_MAX_NAME) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: corrupt safetensors header: __metadata__ key \"%s\" is too long "
                     "(expected at most %d bytes, got %zu)",
                     path, show(kv->string, s), ST_MAX_NAME, strlen(kv->string));
            ok = false;
            break;
        }
        keys[k++] = kv->string;
    }
    ok = ok && unique_names(path, "__metadata__ key", keys, k, d);
    free(keys);
    if (!ok)
        return false;
    f->key = xcalloc((size_t)m + 1, sizeof *f->key);
    f->val = xcalloc((size_t)m + 1, sizeof *f->val);
    cJSON_ArrayForEach(kv, e)
    {
        f->key[f->nmeta] = xstrdup(kv->string);
        f->val[f->nmeta++] = xstrdup(kv->valuestring);
    }
    return true;
}

/* Validates the whole header before allocating anything it sizes: every
 * name unique (tensors and __metadata__ alike), every span inside the data
 * section and none overlapping; then reads each tensor's bytes. What the
 * file can make kiln allocate is bounded by the file's size and the ST_MAX_
 * limits above. */
bool rt_st_read(const char *path, StFile *f, Diag *d)
{
    memset(f, 0, sizeof *f);
    /* O_NONBLOCK: opening a FIFO must not wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot open: %s", path, strerror(errno));
        return false;
    }
    char *hdr = NULL;
    const char **names = NULL;
    cJSON *root = NULL;
    Span *spans = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot read: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: not a safetensors file (expected a regular file, got %s)", path,
                 rt_file_kind(st.st_mode));
        goto fail;
    }
    uint64_t flen = (uint64_t)st.st_size;
    uint8_t len8[8];
    if (flen < 8 || !read_at(fd, len8, 8, 0)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: not a safetensors file (expected an 8-byte header length, file has %llu "
                 "bytes)",
                 path, (unsigned long long)flen);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    if (hlen > flen - 8) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors file: header length %llu exceeds the file (%llu bytes "
                 "after the length)",
                 path, (unsigned long long)hlen, (unsigned long long)(flen - 8));
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors file: header length %llu is too large (expected at "
                 "most %llu bytes, the format's limit)",
                 path, (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    hdr = xmalloc((size_t)hlen + 1);
    errno = 0;
    if (!read_at(fd, hdr, (size_t)hlen, 8)) {
        snprintf(d->msg, sizeof d->msg, "%s: read error in the header: %s", path,
                 errno ? strerror(errno) : "the file is shorter than it was");
        goto fail;
    }
    hdr[hlen] = 0;
    size_t nval = json_values_bound(hdr, (size_t)hlen);
    if (nval > ST_MAX_VALUES) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors header: too many JSON values (expected at most %d, "
                 "got up to %zu)",
                 path, ST_MAX_VALUES, nval);
        goto fail;
    }
    const char *jend = NULL;
    root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &jend, false);
    if (root && jend)
        for (const char *c = jend; c < hdr + hlen; c++)
            if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r') {
                snprintf(d->msg, sizeof d->msg,
                         "%s: corrupt safetensors file: the header has bytes after its JSON "
                         "object (expected space padding, got byte 0x%02x at offset %zu)",
                         path, (unsigned)(uint8_t)*c, (size_t)(c - hdr) + 8);
                goto fail;
            }
    if (!cJSON_IsObject(root)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors file: the header is not a JSON object", path);
        goto fail;
    }
    uint64_t dlen = flen - 8 - hlen, data0 = 8 + hlen;
    int nkeys = cJSON_GetArraySize(root);
    if (nkeys > ST_MAX_TENSORS + 1) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors header: %d entries (expected at most %d tensors and "
                 "__metadata__)",
                 path, nkeys, ST_MAX_TENSORS);
        goto fail;
    }
    names = xcalloc((size_t)nkeys + 1, sizeof *names);
    int nn = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        size_t l = strlen(e->string);
        if (l > ST_MAX_NAME) {
            char s[80];
            snprintf(d->msg, sizeof d->msg,
                     "%s: corrupt safetensors header: tensor name \"%s\" is too long (expected "
                     "at most %d bytes, got %zu)",
                     path, show(e->string, s), ST_MAX_NAME, l);
            goto fail;
        }
        names[nn++] = e->string;
    }
    if (!unique_names(path, NULL, names, nn, d))
        goto fail;
    f->t = xcalloc((size_t)nkeys + 1, sizeof *f->t);
    spans = xcalloc((size_t)nkeys + 1, sizeof *spans);
    int ns = 0;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!read_meta(path, e, f, d))
                goto fail;
            continue;
        }
        StTensor *t = &f->t[f->n];
        uint64_t b, en;
        if (!parse_entry(path, e, t, dlen, &b, &en, d))
            goto fail;
        t->name = xstrdup(e->string);
        f->n++;
        if (en > b)
            spans[ns++] = (Span){b, en, t->name};
    }
    /* no two tensors share a byte: the data read below is at most dlen */
    qsort(spans, (size_t)ns, sizeof *spans, span_cmp);
    for (int i = 1; i < ns; i++)
        if (spans[i].begin < spans[i - 1].end) {
            char s1[80], s2[80];
            snprintf(d->msg, sizeof d->msg,
                     "%s: corrupt safetensors file: tensors \"%s\" [%llu, %llu] and \"%s\" "
                     "[%llu, %llu] overlap (expected disjoint data_offsets)",
                     path, show(spans[i - 1].name, s1), (unsigned long long)spans[i - 1].begin,
                     (unsigned long long)spans[i - 1].end, show(spans[i].name, s2),
                     (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end);
            goto fail;
        }
    int ti = 0;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        StTensor *t = &f->t[ti++];
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        t->data = malloc(t->nbytes ? t->nbytes : 1);
        if (!t->data) {
            char s[80];
            snprintf(d->msg, sizeof d->msg, "%s: cannot allocate %zu bytes for tensor \"%s\"",
                     path, t->nbytes, show(t->name, s));
            goto fail;
        }
        errno = 0;
        if (!read_at(fd, t->data, t->nbytes, data0 + b)) {
            char s[80];
            snprintf(d->msg, sizeof d->msg, "%s: read error in tensor \"%s\": %s", path,
                     show(t->name, s),
                     errno ? strerror(errno) : "the file is shorter than it was");
            goto fail;
        }
    }
    free(spans);
    free(names);
    cJSON_Delete(root);
    free(hdr);
    close(fd);
    return true;
fail:
    free(spans);
    free(names);
    cJSON_Delete(root);
    free(hdr);
    close(fd);
    rt_st_free(f);
    return false;
}

bool rt_st_write(const char *path, const StTensor *t, int n, const char *const *key,
                 const char *const *val, int nmeta, Diag *d)
{
    cJSON *root = cJSON_CreateObject();
    if (nmeta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; i < nmeta; i++)
            cJSON_AddStringToObject(m, key[i], val[i]);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        cJSON_AddStringToObject(e, "dtype", st_names[t[i].dtype]);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int k = 0; k < t[i].rank; k++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].dim[k]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        off += t[i].nbytes;
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    size_t jl = strlen(js), hl = (jl + 7) & ~(size_t)7; /* pad with spaces to 8 bytes */
    char *hdr = xmalloc(8 + hl);
    uint64_t h = hl;
    for (int i = 0; i < 8; i++)
        hdr[i] = (char)(h >> (8 * i));
    memcpy(hdr + 8, js, jl);
    memset(hdr + 8 + jl, ' ', hl - jl);
    free(js);

    const void **chunk = xcalloc((size_t)n + 1, sizeof *chunk);
    size_t *len = xcalloc((size_t)n + 1, sizeof *len);
    chunk[0] = hdr;
    len[0] = 8 + hl;
    for (int i = 0; i < n; i++) {
        chunk[i + 1] = t[i].data;
        len[i + 1] = t[i].nbytes;
    }
    bool ok = rt_write_atomic(path, chunk, len, n + 1, d);
    free(chunk);
    free(len);
    free(hdr);
    return ok;
}
