/* pp_balance.c - `kiln train --pp-balance time`: the stage cut balanced by
 * time measured on this machine's CPU backend instead of the cost model's
 * FLOPs and bytes (passes/stages.c).
 *
 * The forward graph is cut at every place the cut may take where one
 * tensor crosses (pass_stage_pieces: in a transformer each half-block);
 * each piece's graph, differentiated as a stage's is (its F, B and W as one
 * program), is compiled for the CPU with one thread and run on zeros, the
 * fastest of PP_TIME_RUNS runs after one to warm up. One rank times the
 * pieces (world rank 0, alone, while the others wait in the broadcast that
 * follows, so no two timings share the cores), and every rank cuts with
 * its times (pass_stage_cut_timed): the ranks agree on the cut. */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PP_TIME_RUNS = 5 };


/* Program g compiled for the CPU (one thread) with its inputs zeros
 * (valid token ids, no NaN); NULL with d set. */
static Exec *prog(Graph *g, const PassOpts *bo, Diag *d)
{
    if (!pass_simplify(g, bo, d) || !pass_fuse(g, bo, d) || !pass_schedule(g, bo, d))
        return NULL;
    ExecOpts eo = {.device = "cpu", .threads = 1};
    Exec *e = rt_exec_create(g, &eo, d);
    if (!e)
        return NULL;
    int64_t most = 0;
    for (int t = 0; t < g->t.n; t++)
        if (g->t.v[t].op < 0 && shape_bytes(&g->t.v[t].s) > most)
            most = shape_bytes(&g->t.v[t].s);
    void *zero = xcalloc((size_t)most + 1, 1);
    for (int t = 0; t < g->t.n; t++)
        if (g->t.v[t].op < 0 && (g->t.v[t].kind == TK_INPUT || g->t.v[t].kind == TK_PARAM ||
                                 g->t.v[t].kind == TK_STATE))
            rt_exec_write(e, t, zero);
    free(zero);
    return e;
}

/* A stashed tensor ("pp.stash.T") between programs, on the host. */
typedef struct {
    const char *name;
    void *buf;
} Stash;

/* The differentiated stage graph full split as pass_stage_split splits it
 * and run as pp.c runs a micro-batch: F, B and W apart, the stashes
 * through host buffers; into *secs the fastest of PP_TIME_RUNS rounds
 * after one. False with d set. */
static bool time_split(const Graph *full, bool last, const PassOpts *bo, double *secs, Diag *d)
{
    Graph *g[3];
    Exec *e[3] = {0};
    VEC(Stash) st = {0};
    pass_stage_split(full, last, &g[0], &g[1], &g[2]);
    bool ok = true;
    for (int k = 0; ok && k < 3; k++)
        ok = g[k]->ops.n == 0 || (e[k] = prog(g[k], bo, d)) != NULL;
    for (int k = 0; ok && k < 3; k++) /* the stashes F and B leave */
        for (int i = 0; i < g[k]->outs.n; i++)
            if (strncmp(g[k]->outs.v[i].name, "pp.stash.", 9) == 0)
                vec_push(&st, ((Stash){g[k]->outs.v[i].name,
                                       xcalloc((size_t)shape_bytes(
                                           &g[k]->t.v[g[k]->outs.v[i].t].s) + 1, 1)}));
    *secs = -1;
    for (int r = 0; ok && r <= PP_TIME_RUNS; r++) {
        double t0 = ir_now();
        for (int k = 0; ok && k < 3; k++) {
            if (!e[k])
                continue;
            for (int u = 0; u < g[k]->t.n; u++) /* its stashed inputs */
                for (int i = 0; g[k]->t.v[u].op < 0 && g[k]->t.v[u].name && i < st.n; i++)
                    if (strcmp(st.v[i].name, g[k]->t.v[u].name) == 0)
                        rt_exec_write(e[k], u, st.v[i].buf);
            ok = rt_exec_run(e[k], 1, 0, d);
            for (int i = 0; ok && i < g[k]->outs.n; i++)
                for (int x = 0; x < st.n; x++)
                    if (strcmp(st.v[x].name, g[k]->outs.v[i].name) == 0)
                        rt_exec_read(e[k], g[k]->outs.v[i].t, st.v[x].buf);
        }
        double dt = ir_now() - t0;
        if (ok && r > 0 && (*secs < 0 || dt < *secs))
            *secs = dt;
    }
    for (int i = 0; i < st.n; i++)
        free(st.v[i].buf);
    vec_free(&st);
    for (int k = 0; k < 3; k++) {
        if (e[k])
            rt_exec_destroy(e[k]);
        ir_free(g[k]);
    }
    return ok;
}

/* Piece j of pc, differentiated, into *secs as a stage after the first
 * runs it (F, B and W) and into *secs0 as the first stage does: no B, the
 * received tensors' gradients made in W (they stay inside the stage).
 * False with d set. */
static bool time_piece(const Graph *fwd, const PassStageCut *pc, int j, const PassOpts *po,
                       double *secs, double *secs0, Diag *d)
{
    Graph *full = pass_stage_graph(fwd, pc, j, true);
    PassOpts bo = *po;
    bo.grad_accum = 1;
    bo.nranks = 1;
    bool last = j == pc->n - 1;
    bool ok = pass_autodiff(full, &bo, d) && time_split(full, last, &bo, secs, d);
    if (ok && j > 0) {
        for (int i = 0; i < full->outs.n; i++) /* grad.pp.recv.K: W's, not B's */
            if (strncmp(full->outs.v[i].name, "grad.pp.recv.", 13) == 0) {
                char nm[64];
                snprintf(nm, sizeof nm, "grad.pp.first.%s", full->outs.v[i].name + 13);
                full->outs.v[i].name = intern(nm);
            }
        ok = time_split(full, last, &bo, secs0, d);
    } else if (ok) {
        *secs0 = *secs;
    }
    ir_free(full);
    return ok;
}

bool rt_pp_cut_timed(RtComm *comm, const Graph *fwd, int n, const PassOpts *po,
                     PassStageCut *c, double *stage_s, Diag *d)
{
    if (rt_comm_tp(comm) > 1) {
        snprintf(d->msg, sizeof d->msg,
                 "--pp-balance time: times the stages on one rank's CPU, without tensor "
                 "parallelism (expected tp = 1, got tp = %d; --pp-balance cost cuts by the "
                 "cost model)", rt_comm_tp(comm));
        return false;
    }
    PassStageCut pc;
    if (!pass_stage_pieces(fwd, &pc, d))
        return false;
    /* secs[pc.n]: 0 ok, 1 failed (then the message follows in msg) */
    /* secs[j], secs[pc.n + j]: piece j's times (time_piece); secs[2 pc.n]:
     * 0 ok, 1 failed (the message in msg) */
    size_t nb = sizeof(double) * (size_t)(2 * pc.n + 1);
    double *secs = xcalloc((size_t)(2 * pc.n + 1), sizeof(double));
    char msg[sizeof d->msg] = {0};
    if (rt_comm_world_rank(comm) == 0)
        for (int j = 0; j < pc.n && secs[2 * pc.n] == 0; j++)
            if (!time_piece(fwd, &pc, j, po, &secs[j], &secs[pc.n + j], d)) {
                secs[2 * pc.n] = 1;
                snprintf(msg, sizeof msg, "--pp-balance time: timing piece %d of %d: %.1900s",
                         j, pc.n, d->msg);
            }
    /* from world rank 0 (stage 0, dp rank 0) over its dp group, then
     * along every pipeline from its stage 0 */
    rt_comm_bcast(comm, secs, nb);
    rt_comm_bcast(comm, msg, sizeof msg);
    rt_comm_pp_bcast(comm, 0, secs, nb);
    rt_comm_pp_bcast(comm, 0, msg, sizeof msg);
    bool ok = secs[2 * pc.n] == 0;
    if (!ok)
        snprintf(d->msg, sizeof d->msg, "%s", msg);
    else
        ok = pass_stage_cut_timed(fwd, n, &pc, secs, secs + pc.n, c, d);
    for (int s = 0; ok && s < n; s++) /* c->cost: the measured seconds */
        stage_s[s] = c->cost[s];
    if (ok && getenv("KILN_PP_BALANCE_DEBUG"))
        for (int j = 0; j < pc.n; j++)
            fprintf(stderr, "pp-balance: piece %d ops %d..%d: %.3f ms apart, %.3f ms first\n",
                    j, pc.first[j], pc.first[j + 1] - 1, 1e3 * secs[j], 1e3 * secs[pc.n + j]);
    free(secs);
    pass_stage_cut_free(&pc);
    return ok;
}
