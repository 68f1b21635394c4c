/* safetensors.c - safetensors files: a validating reader and an atomic
 * writer (temp file in the same directory, fsync, rename). */
#include "runtime.h"

#include <cjson/cJSON.h>
#include <errno.h>
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

typedef struct {
    uint64_t begin, end;
    const char *name;
} Span;

static int span_cmp(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parses one tensor entry into t (data not yet read). */
static bool parse_entry(const char *path, const cJSON *e, StTensor *t, uint64_t *begin,
                        uint64_t *end, Diag *d)
{
    const char *nm = e->string;
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
        snprintf(d->msg, sizeof d->msg,
                 "%s: tensor \"%s\" has unsupported dtype (expected F32, BF16, F16, I32, I64 "
                 "or U8, got %s)",
                 path, nm, dt->valuestring);
        return false;
    }
    int rank = cJSON_GetArraySize(sh);
    if (rank > IR_MAX_RANK) {
        snprintf(d->msg, sizeof d->msg, "%s: tensor \"%s\" has rank %d (at most %d supported)",
                 path, nm, rank, IR_MAX_RANK);
        return false;
    }
    t->dtype = (DType)dtype;
    t->rank = rank;
    uint64_t numel = 1;
    for (int i = 0; i < rank; i++) {
        const cJSON *x = cJSON_GetArrayItem(sh, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e15 ||
            x->valuedouble != (double)(int64_t)x->valuedouble) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: tensor \"%s\" has a bad shape (dim %d is not a non-negative integer)",
                     path, nm, i);
            return false;
        }
        t->dim[i] = (int64_t)x->valuedouble;
        numel *= (uint64_t)t->dim[i];
    }
    double o[2];
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(off, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9e15) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: tensor \"%s\" has bad data_offsets (not non-negative integers)", path,
                     nm);
            return false;
        }
        o[i] = x->valuedouble;
    }
    *begin = (uint64_t)o[0];
    *end = (uint64_t)o[1];
    uint64_t want = numel * (uint64_t)dtype_size(t->dtype);
    if (*end < *begin || *end - *begin != want) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: tensor \"%s\": data_offsets [%llu, %llu] do not match its dtype and "
                 "shape (expected %llu bytes for %s x %llu elements, got %lld)",
                 path, nm, (unsigned long long)*begin, (unsigned long long)*end,
                 (unsigned long long)want, st_names[t->dtype], (unsigned long long)numel,
                 (long long)(*end - *begin));
        return false;
    }
    t->nbytes = (size_t)want;
    return true;
}

bool rt_st_read(const char *path, StFile *f, Diag *d)
{
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot open: %s", path, strerror(errno));
        return false;
    }
    fseek(fp, 0, SEEK_END);
    long flen = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = NULL;
    cJSON *root = NULL;
    Span *spans = NULL;
    if (flen < 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot read (not a regular file?)", path);
        goto fail;
    }
    buf = xmalloc((size_t)flen + 1);
    if (fread(buf, 1, (size_t)flen, fp) != (size_t)flen) {
        snprintf(d->msg, sizeof d->msg, "%s: read error", path);
        goto fail;
    }
    if (flen < 8) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: not a safetensors file (expected an 8-byte header length, file has %ld "
                 "bytes)",
                 path, flen);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > (uint64_t)flen - 8) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors file: header length %llu exceeds the file (%ld bytes "
                 "after the length)",
                 path, (unsigned long long)hlen, flen - 8);
        goto fail;
    }
    root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt safetensors file: the header is not a JSON object", path);
        goto fail;
    }
    uint64_t dlen = (uint64_t)flen - 8 - hlen;
    const uint8_t *data = buf + 8 + hlen;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) n++;
    f->t = xcalloc((size_t)n + 1, sizeof *f->t);
    spans = xcalloc((size_t)n + 1, sizeof *spans);
    int ns = 0;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                snprintf(d->msg, sizeof d->msg,
                         "%s: corrupt safetensors header: __metadata__ is not an object", path);
                goto fail;
            }
            int m = cJSON_GetArraySize(e);
            f->key = xcalloc((size_t)m + 1, sizeof *f->key);
            f->val = xcalloc((size_t)m + 1, sizeof *f->val);
            const cJSON *kv;
            cJSON_ArrayForEach(kv, e)
            {
                if (!cJSON_IsString(kv)) {
                    snprintf(d->msg, sizeof d->msg,
                             "%s: corrupt safetensors header: __metadata__ value \"%s\" is not "
                             "a string",
                             path, kv->string);
                    goto fail;
                }
                f->key[f->nmeta] = xstrdup(kv->string);
                f->val[f->nmeta++] = xstrdup(kv->valuestring);
            }
            continue;
        }
        if (rt_st_find(f, e->string)) {
            snprintf(d->msg, sizeof d->msg, "%s: tensor \"%s\" appears twice", path,
                     e->string);
            goto fail;
        }
        StTensor *t = &f->t[f->n];
        uint64_t b, en;
        if (!parse_entry(path, e, t, &b, &en, d))
            goto fail;
        if (en > dlen) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: corrupt safetensors file: tensor \"%s\" data_offsets [%llu, %llu] "
                     "out of range (the data section has %llu bytes)",
                     path, e->string, (unsigned long long)b, (unsigned long long)en,
                     (unsigned long long)dlen);
            goto fail;
        }
        t->name = xstrdup(e->string);
        t->data = xmalloc(t->nbytes);
        memcpy(t->data, data + b, t->nbytes);
        f->n++;
        spans[ns++] = (Span){b, en, t->name};
    }
    qsort(spans, (size_t)ns, sizeof *spans, span_cmp);
    for (int i = 1; i < ns; i++)
        if (spans[i].begin < spans[i - 1].end) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: corrupt safetensors file: tensors \"%s\" and \"%s\" overlap", path,
                     spans[i - 1].name, spans[i].name);
            goto fail;
        }
    free(spans);
    cJSON_Delete(root);
    free(buf);
    fclose(fp);
    return true;
fail:
    free(spans);
    cJSON_Delete(root);
    free(buf);
    fclose(fp);
    rt_st_free(f);
    return false;
}

static bool write_all(int fd, const void *p, size_t n)
{
    const uint8_t *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        c += k;
        n -= (size_t)k;
    }
    return true;
}

bool rt_write_atomic(const char *path, const void *const *chunk, const size_t *len, int n,
                     Diag *d)
{
    char *tmp = xasprintf("%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", path, strerror(errno));
        free(tmp);
        return false;
    }
    bool ok = true;
    for (int i = 0; ok && i < n; i++)
        ok = write_all(fd, chunk[i], len[i]);
    int err = ok ? 0 : errno;
    if (ok && (fchmod(fd, 0644) != 0 || fsync(fd) != 0))
        ok = false, err = errno;
    if (close(fd) != 0 && ok)
        ok = false, err = errno;
    if (ok && rename(tmp, path) != 0)
        ok = false, err = errno;
    if (!ok) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", path, strerror(err));
        unlink(tmp);
    } else {
        /* make the rename durable */
        char *dir = xstrdup(path);
        char *slash = strrchr(dir, '/');
        if (slash)
            slash[slash == dir] = 0; /* keep "/" for a file in the root */
        int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    free(tmp);
    return ok;
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
