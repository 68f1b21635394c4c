/* fuse_internal.h - what the files of the fuse pass share; not for other
 * passes (their interface is passes.h). The pass, one file per job:
 *   fuse.c            the entry point, merging two groups (the union is one
 *                     loop domain and stays convex); sibling merges
 *   fuse_grow.c       the first grouping: one group per fusable op, merged
 *                     with its producers' groups, near-linear in the ops
 *   fuse_domain.c     loop domains (FuseDomain), whether an op set fits one,
 *                     materialised tensors
 *   fuse_col.c        column groups: splitting a column group that would
 *                     store full-shape results, pulling a column
 *                     reduction's prologue into it
 *   fuse_multi.c      multi-tensor merge of the optimizer's update groups
 *   fuse_recompute.c  cheap recompute: const/iota/broadcast clones per
 *                     consumer before grouping, cheap elementwise chains
 *                     cloned into their reader groups after it
 *   fuse_lower.c      the lowerability check codegen calls too
 *                     (pass_fuse_lowers), and dropping groups that fail it
 *   fuse_dump.c       statistics and the dump's group lines
 * Fuser is the grouping state every step between the first grouping and
 * the final group ids works on: gof[op] is the op's group (index into gr),
 * a dead group has no members, members are kept in program order
 * (pass_fuse_sort_members) after each step. */
#ifndef KILN_FUSE_INTERNAL_H
#define KILN_FUSE_INTERNAL_H

#include "passes.h"

/* Membership lookup for one candidate op set: with gof set, the ops whose
 * group gof[op] is ga or gb (the union of two groups, nothing to mark);
 * else mark[op] == stamp (the pass keeps one array and bumps the stamp per
 * candidate), or, with mark NULL, a binary search of the ascending op list
 * sorted[0..nsorted) (no array as large as the graph for one group). */
typedef struct {
    int *mark;
    int stamp;
    const int *sorted;
    int nsorted;
    const int *gof;
    int ga, gb;
} FuseMarks;

typedef struct {
    VEC(int) ops;      /* members, op indices */
    bool dead, multi;  /* multi: a multi-tensor group (several loop nests), final */
} FGroup;

typedef struct {
    Graph *g;
    VEC(FGroup) gr;
    int *gof;          /* op -> group index, -1: unfused */
    int *vis_op, *vis_gr, stamp;
    VEC(int) stack;
    FuseMarks mk;
    char err[256];
    const int *uoff, *ucons; /* use lists of the graph being grouped */
    int upto;               /* ops [0, upto) have been visited by the main loop */
    /* A topological order of the contracted graph (each live group one
     * node, each ungrouped op one node), or NULL: ord_gr[G], ord_op[op]
     * (for ungrouped ops). While set, every merge keeps it valid
     * (pass_fuse_order_merge) and the convexity check visits only nodes
     * ordered after the group it looks for. */
    int *ord_gr, *ord_op;
    VEC(int) fwd, bwd;      /* pass_fuse_order_merge's work lists */
} Fuser;

/* Use lists: consumers of tensor t are cons[off[t] .. off[t+1]); an op
 * reading t twice is listed once, and the range may end in -1 holes. */
typedef struct {
    int *off, *cons;
} Uses;

/* ---- fuse_domain.c ---- */
bool pass_fuse_is_reduce(const Op *op); /* reduce_sum, reduce_max or reduce_logsumexp */
/* Reduction axes pattern: FUSE_ROW with *k = first axis for trailing axes,
 * FUSE_COL with *k = count for leading axes; -1 for anything else. */
int pass_fuse_reduce_pattern(const Graph *g, const Op *op, int *k);
/* The index of x in ascending v[0..n), or -1. */
int pass_fuse_find_sorted(const int *v, int n, int x);
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

/* ---- fuse.c: the grouping ---- */
/* A Fuser for g with no groups yet (every op ungrouped), its use lists,
 * and the order of the ungrouped graph (program order): what step 2 needs.
 * pass_fuse_fuser_free frees what it holds, not g. */
void pass_fuse_fuser_init(Fuser *f, Graph *g);
void pass_fuse_fuser_free(Fuser *f);
Uses pass_fuse_uses_build(const Graph *g);
void pass_fuse_uses_free(Uses *u);
void pass_fuse_sort_ints(int *v, int n);      /* ascending */
void pass_fuse_sort_members(Fuser *f, int G); /* program order */
int pass_fuse_new_group(Fuser *f, int op);    /* a group of op alone; its index */
/* Merges group B into A when neither is dead or multi-tensor, the union is
 * one loop domain that every member fits, it keeps forward ops and
 * recomputations apart, and it is convex. */
bool pass_fuse_try_merge(Fuser *f, int A, int B);
/* Whether the union of groups A and B is one loop domain that every member
 * fits (and, for a column domain, pass_fuse_col_ok); its domain into *d
 * (may be NULL). Leaves f->mk marking the union. */
bool pass_fuse_union_ok(Fuser *f, int A, int B, FuseDomain *d);
/* No path from A to B or B to A through ops outside A and B. */
bool pass_fuse_convex_union(Fuser *f, int A, int B);
/* Computes the topological order of the contracted graph (ord_gr,
 * ord_op); leaves them NULL when the contracted graph has a cycle. */
void pass_fuse_order_build(Fuser *f);
void pass_fuse_order_free(Fuser *f);
/* Before pass_fuse_do_union(f, A, B) of a union that passed
 * pass_fuse_convex_union: reorders the nodes between A and B so that the
 * order stays topological once A and B are one node. */
void pass_fuse_order_merge(Fuser *f, int A, int B);
/* Moves B's members into A (B dead; A multi when B was). */
void pass_fuse_do_union(Fuser *f, int A, int B);
/* COL op set ops[0..n) (marked in f->mk): no reduction's input depends on
 * another reduction of the set (the kernel walks all rows once). */
bool pass_fuse_col_ok(Fuser *f, const int *ops, int n);
/* The loop domain of group G's members (pass_fuse_domain_of, err in
 * f->err); leaves f->mk marking them. */
bool pass_fuse_group_domain(Fuser *f, int G, FuseDomain *d);
/* The materialised set of the current grouping (gof), by tensor; sets
 * Op.group to gof. Caller frees. */
bool *pass_fuse_cur_materialised(Fuser *f);

/* ---- fuse_grow.c ---- */
/* Step 2: in program order each fusable op starts a group and merges its
 * producers' groups (pass_fuse_try_merge's rules), then the producers of
 * the broadcasts it pulled in. Needs the order (ord_gr) built on the
 * ungrouped graph; leaves the groups as pass_fuse_try_merge would, by
 * index, with members in program order (ord_gr is stale: free it). */
void pass_fuse_grow(Fuser *f);

/* ---- fuse_col.c ---- */
void pass_fuse_split_col(Fuser *f);
void pass_fuse_pull_col(Fuser *f);

/* ---- fuse_multi.c ---- */
void pass_fuse_merge_multi(Fuser *f);

/* ---- fuse_recompute.c ---- */
/* which: 0 broadcasts, 1 consts and iotas. Before grouping. */
void pass_fuse_clone_cheap(Graph *g, int which);
/* After the group ids are final (Op.group). */
void pass_fuse_recompute_cheap(Graph *g);

/* ---- fuse_lower.c ---- */
/* Whether a loop over domain d would have to store op's result (needed
 * outside its kernel: mat, pass_fuse_materialised) at full shape from a
 * column-order loop, which writes per-column results only. False for
 * domains other than FUSE_COL, for reductions and matmuls. */
bool pass_fuse_col_stores_full(const Graph *g, const FuseDomain *d, const Op *op,
                               const bool *mat);
void pass_fuse_drop_unlowerable(Fuser *f);

#endif
