/* conv.c - the geometry of im2col and col2im (AK_CONV): how many output
 * positions a kernel, stride, padding and dilation give on an image, the
 * one computation that ir_infer, the interpreter and codegen read. */
#include "ir.h"

#include <stdio.h>
#include <string.h>

bool ir_conv_geometry(const Shape *img, const OpAttr *a, IrConv *cv, char *err, size_t errlen)
{
    static const char *what[4] = {"kernel", "stride", "pad", "dilation"};
    memset(cv, 0, sizeof *cv);
    if (a->nia != 4 && a->nia != 8) {
        snprintf(err, errlen, "needs kernel, stride, pad and dilation for 1 or 2 spatial dims "
                              "(expected 4 or 8 attribute entries, got %d)", a->nia);
        return false;
    }
    int ns = a->nia / 4;
    cv->ns = ns;
    for (int i = 0; i < ns; i++) {
        for (int w = 0; w < 4; w++) {
            int64_t v = a->ia[w * ns + i], lo = w == 2 ? 0 : 1;
            if (v < lo || v > ((int64_t)1 << 40)) {
                snprintf(err, errlen, "%s[%d] out of range (expected %lld .. 2^40, got %lld)",
                         what[w], i, (long long)lo, (long long)v);
                return false;
            }
        }
        cv->k[i] = a->ia[i];
        cv->s[i] = a->ia[ns + i];
        cv->p[i] = a->ia[2 * ns + i];
        cv->d[i] = a->ia[3 * ns + i];
    }
    if (img->rank != ns + 2) {
        snprintf(err, errlen, "the image must be [N, C, %s] (expected rank %d, got rank %d)",
                 ns == 1 ? "L" : "H, W", ns + 2, img->rank);
        return false;
    }
    cv->n = img->dim[0];
    cv->c = img->dim[1];
    cv->kk = 1;
    for (int i = 0; i < ns; i++) {
        cv->in[i] = img->dim[2 + i];
        /* the kernel's span d (k - 1) + 1 against the padded size, both
         * checked for overflow (k and d are each at most 2^40) */
        int64_t span, room;
        if (!ir_mul_ok(cv->d[i], cv->k[i] - 1, &span) || !ir_add_ok(cv->in[i], 2 * cv->p[i], &room))
            span = INT64_MAX, room = 0;
        if (room - span - 1 < 0) {
            snprintf(err, errlen, "the kernel does not fit spatial dim %d (expected size + 2*pad "
                     ">= dilation*(kernel-1)+1, got size %lld, pad %lld, kernel %lld, "
                     "dilation %lld)", i, (long long)cv->in[i], (long long)cv->p[i],
                     (long long)cv->k[i], (long long)cv->d[i]);
            return false;
        }
        cv->out[i] = (room - span - 1) / cv->s[i] + 1;
        if (!ir_mul_ok(cv->kk, cv->k[i], &cv->kk)) {
            snprintf(err, errlen, "the kernel has more than 2^62 elements");
            return false;
        }
    }
    return true;
}
