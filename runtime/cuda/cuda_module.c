/* cuda_module.c - the CUDA module's own small helpers (cuda_module.h). */
#include "cuda_module.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void kc_fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: cuda: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void *kc_zalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p)
        kc_fatal("out of memory (%zu bytes)", n);
    return p;
}

char *kc_dupstr(const char *s)
{
    char *p = kc_zalloc(strlen(s) + 1);
    strcpy(p, s);
    return p;
}

void kc_dmsg(Diag *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    va_end(ap);
}

double kc_now(void)
{
    return ir_now(); /* inline in ir.h: the one clock, without linking kilncore */
}
