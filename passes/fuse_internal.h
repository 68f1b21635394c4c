/* fuse_internal.h - what the fuse pass (fuse.c) and its domain analysis
 * (fuse_domain.c) share; not for other passes (their interface is passes.h). */
#ifndef KILN_FUSE_INTERNAL_H
#define KILN_FUSE_INTERNAL_H

#include "passes.h"

/* Membership lookup for one candidate op set: mark[op] == stamp (the pass
 * keeps one array and bumps the stamp per candidate). */
typedef struct {
    int *mark;
    int stamp;
} FuseMarks;

bool pass_fuse_is_reduce(const Op *op); /* reduce_sum or reduce_max */
/* Reduction axes pattern: FUSE_ROW with *k = first axis for trailing axes,
 * FUSE_COL with *k = count for leading axes; -1 for anything else. */
int pass_fuse_reduce_pattern(const Graph *g, const Op *op, int *k);
/* Whether tensor t is the result of an op of the set. */
bool pass_fuse_in_set(const Graph *g, const FuseMarks *m, int t);
/* The loop domain of op set ops[0..n) (marked in m); false with err set
 * when the set has none. */
bool pass_fuse_domain_of(const Graph *g, const int *ops, int n, const FuseMarks *m,
                         FuseDomain *d, char *err, size_t errlen);
/* Whether shape s is the domain's full shape (*row false) or its per-row
 * (per-column) shape (*row true). */
bool pass_fuse_fits(const FuseDomain *d, const Shape *s, bool *row);
/* Whether every member of the set fits domain d; false with err set. */
bool pass_fuse_check_members(const Graph *g, const int *ops, int n, const FuseMarks *m,
                             const FuseDomain *d, char *err, size_t errlen);

#endif
