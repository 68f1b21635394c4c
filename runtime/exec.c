/* exec.c - the executor: plans the final graph, hands the plan to a backend,
 * and walks the plan's steps every run (ops in schedule order, then update
 * copies). Allreduce steps go to the communication thread (RtComm), or to
 * the backend when it runs collectives on the device (BackendExt.comm_setup);
 * TP steps run on the host (start_tp, overlapped), or on the device
 * (BackendExt.tp_setup).
 * Optional per-step timing for the profile and the trace: from the
 * backend's device events where it records them, else on the host with a
 * synchronisation after every step. */
#include "codegen.h"
#include "cg_cuda.h" /* rt_dump_kernels: the CUDA C of each kernel */
#include "runtime.h"
#include "dist.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    void (*fn)(void *arg, int id);
    void *arg;
    int id;
    int next; /* the step's next hook, -1 */
} ExecHook;

struct Exec {
    Graph *g; /* own copy: the plan borrows it */
    CgPlan *plan;
    const Backend *be;
    BackendCtx *ctx;
    ExecOpts o;
    /* profile */
    int *row_of;          /* per step: index in rows */
    VEC(RtProfRow) rows;
    RtProfRow *sorted;
    RtTraceEvent *trace;  /* per step, last run */
    double *step_flops, *step_bytes;
    bool dev_prof;        /* profile from BackendExt.step_times */
    double *dev_start, *dev_end;
    /* collectives on the device (BackendExt.comm_setup accepted the plan) */
    bool dev_comm;
    RtCommEvent *cev;     /* room for one run's bucket events */
    int ncev;
    bool dev_pp;          /* pipeline transfers on the device (rt_exec_pp_setup) */
    /* TP steps on the device (BackendExt.tp_setup accepted the plan) */
    bool dev_tp;
    RtCommEvent *tpev;    /* room for one run's TP collectives (pull_tp) */
    int ntpev;
    /* zero=1: all-gather waits carried into the next run (setup_defer) */
    int nb;               /* buckets */
    int *first_reader;    /* per bucket: plan step that first reads its params; -1:
                             not deferred */
    bool *deferred;       /* per step: an all-gather wait left to the next run */
    int *wait_head;       /* per step: first bucket whose first reader it is, -1 */
    int *wait_next;       /* per bucket: the next bucket of its first reader, -1 */
    bool *pending;        /* per bucket: its gather is in flight across runs */
    int *root_bucket;     /* per tensor: the deferred bucket writing its storage, -1 */
    /* rt_exec_before_read: callbacks before a plan step, per run */
    VEC(ExecHook) hooks;
    int *hook_at;         /* per step: first hook (index in hooks), -1 */
    int release_at;       /* zero=1 in pieces: the all-gather starts up to this step are
                             released to the communication thread at once (pieces.c); -1 */
    Exec *arena_of;       /* ExecOpts.arena_of when e runs in its arena; else NULL */
    /* TP collectives in flight (host backends; setup_tp) */
    int *tp_handle;       /* per step: a CG_STEP_TP step's collective in flight, -1 */
    int *tp_wait_head;    /* per step: first TP step whose result it reads first, -1 */
    int *tp_wait_next;    /* per TP step: the next one its first reader waits for, -1 */
    int tp_inflight;
};

/* zero=1: a deferred bucket's gather may still be writing its params. On
 * the device (dev_comm) the compute stream waits for it (the backend's wait
 * of one of the bucket's deferred steps), not the host. */
static void wait_bucket(Exec *e, int b)
{
    if (e->pending && e->pending[b]) {
        e->pending[b] = false;
        if (!e->dev_comm) {
            rt_comm_wait(e->o.comm, b);
            return;
        }
        for (int s = 0; s < e->plan->steps.n; s++)
            if (e->deferred[s] && e->plan->steps.v[s].bucket == b) {
                Diag d;
                if (!e->be->ext->allreduce_wait(e->ctx, s, &d))
                    die("zero=1: the deferred all-gather wait of bucket %d: %s", b, d.msg);
                return;
            }
    }
}

/* zero=1 on several CPU ranks: the all-gather waits at the end of the step
 * (the step graph has no next step to put them in) are carried into the
 * next run, right before the first plan step that reads one of the bucket's
 * params, so the gathers overlap the next forward. Deferred only when no
 * compute step follows the bucket's waits. Every read or write of a param
 * from outside (rt_exec_read, rt_exec_write) and rt_exec_destroy wait for
 * its bucket first, so nobody sees a param mid-gather. */
static void setup_defer(Exec *e)
{
    const CgPlan *p = e->plan;
    const Graph *g = e->g;
    const MemPlan *m = p->mem;
    int n = p->steps.n, last_compute = -1, nb = 0;
    for (int s = 0; s < n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind == CG_STEP_ALLREDUCE_START && st->bucket + 1 > nb)
            nb = st->bucket + 1;
        if (st->op >= 0 && st->kind != CG_STEP_ALLREDUCE_START &&
            st->kind != CG_STEP_ALLREDUCE_WAIT)
            last_compute = s;
    }
    e->nb = nb;
    e->first_reader = xmalloc(sizeof(int) * (size_t)(nb + 1));
    e->pending = xcalloc((size_t)nb + 1, sizeof(bool));
    e->deferred = xcalloc((size_t)n + 1, sizeof(bool));
    e->root_bucket = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    for (int t = 0; t < g->t.n; t++)
        e->root_bucket[t] = -1;
    bool *late = xcalloc((size_t)nb + 1, sizeof(bool)); /* every wait after last_compute */
    for (int b = 0; b < nb; b++)
        e->first_reader[b] = -1, late[b] = true;
    for (int s = 0; s < n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind == CG_STEP_ALLREDUCE_WAIT && s < last_compute)
            late[st->bucket] = false;
    }
    for (int s = 0; s < n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_ALLREDUCE_START || st->coll != CG_COLL_ALL_GATHER ||
            !late[st->bucket])
            continue;
        for (int a = 0; a < st->nargs; a++)
            e->root_bucket[m->root[st->args[a]]] = st->bucket;
    }
    int *ostep = cg_plan_op_steps(e->plan, e->g);
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        int s = ostep[i];
        if (s < 0 || op->code == OP_ALL_GATHER_START || op->code == OP_ALL_GATHER_WAIT)
            continue;
        for (int j = 0; j < op->nin; j++) {
            int b = e->root_bucket[m->root[op->in[j]]];
            if (b >= 0 && (e->first_reader[b] < 0 || s < e->first_reader[b]))
                e->first_reader[b] = s;
        }
    }
    for (int s = 0; s < n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind == CG_STEP_ALLREDUCE_WAIT && st->coll == CG_COLL_ALL_GATHER &&
            e->first_reader[st->bucket] >= 0)
            e->deferred[s] = true;
    }
    /* per step, the buckets it waits for first (run_step) */
    e->wait_head = xmalloc(sizeof(int) * (size_t)(n + 1));
    e->wait_next = xmalloc(sizeof(int) * (size_t)(nb + 1));
    for (int s = 0; s < n; s++)
        e->wait_head[s] = -1;
    for (int b = 0; b < nb; b++) {
        int s = e->first_reader[b];
        e->wait_next[b] = s >= 0 ? e->wait_head[s] : -1;
        if (s >= 0)
            e->wait_head[s] = b;
    }
    free(ostep);
    free(late);
}

int rt_exec_gather_bucket(const Exec *e, int tensor)
{
    if (!e->root_bucket || tensor < 0 || tensor >= e->g->t.n)
        return -1;
    int b = e->root_bucket[e->plan->mem->root[tensor]];
    return b >= 0 && e->first_reader[b] >= 0 ? b : -1;
}

void rt_exec_before_read(Exec *e, const int *tensors, int n, void (*fn)(void *arg, int id),
                         void *arg, int id)
{
    const Graph *g = e->g;
    const MemPlan *m = e->plan->mem;
    bool *want = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    for (int k = 0; k < n; k++)
        want[m->root[tensors[k]]] = true;
    int *ostep = cg_plan_op_steps(e->plan, e->g), first = -1;
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            if (ostep[i] >= 0 && want[m->root[g->ops.v[i].in[j]]] &&
                (first < 0 || ostep[i] < first))
                first = ostep[i];
    free(ostep);
    free(want);
    if (first < 0)
        return;
    if (!e->hook_at) {
        e->hook_at = xmalloc(sizeof(int) * (size_t)(e->plan->steps.n + 1));
        for (int s = 0; s < e->plan->steps.n; s++)
            e->hook_at[s] = -1;
    }
    ExecHook h = {fn, arg, id, e->hook_at[first]};
    vec_push(&e->hooks, h);
    e->hook_at[first] = e->hooks.n - 1;
}

static const char *step_kind(CgStepKind k)
{
    if (k == CG_STEP_ALLREDUCE_START || k == CG_STEP_ALLREDUCE_WAIT || k == CG_STEP_TP)
        return "comm";
    return k == CG_STEP_KERNEL ? "kernel" : k == CG_STEP_GEMM ? "gemm" : "copy";
}

/* A shard_pack step (ir.h): the result is this rank's part of the args'
 * flat range, zero past it (rank-dependent offsets: no kernel of its own).
 * On a host backend with host_ptr it copies from arena to arena; else
 * through a staging buffer and the backend's read and write, so any backend
 * runs it. The args are consecutive in the flat order, so the destination
 * is each arg's part in turn, then zeros. */
static void shard_pack(Exec *e, const CgStep *st)
{
    const CgPlan *p = e->plan;
    int64_t off, len, n = st->bytes / 4;
    ir_shard_range(st->sh_total, st->sh_nranks, rt_comm_rank(e->o.comm), &off, &len);
    float *dst = e->be->host_ptr ? e->be->host_ptr(e->ctx, st->dst) : NULL;
    float *buf = dst ? dst : xmalloc(sizeof(float) * (size_t)(n + 1));
    int64_t f0 = st->sh_start, covered = 0; /* buf[0, covered) written */
    for (int a = 0; a < st->nargs; a++) {
        int64_t k = shape_numel(&p->g->t.v[st->args[a]].s);
        int64_t lo = f0 > off ? f0 : off, hi = f0 + k < off + len ? f0 + k : off + len;
        if (lo < hi) {
            if (lo - off > covered)
                memset(buf + covered, 0, sizeof(float) * (size_t)(lo - off - covered));
            int64_t src = cg_offset(p, st->args[a]) + (lo - f0) * 4;
            if (dst)
                memcpy(buf + (lo - off), e->be->host_ptr(e->ctx, src), (size_t)(hi - lo) * 4);
            else
                e->be->read(e->ctx, src, buf + (lo - off), (hi - lo) * 4);
            covered = hi - off;
        }
        f0 += k;
    }
    if (n > covered)
        memset(buf + covered, 0, sizeof(float) * (size_t)(n - covered));
    if (!dst) {
        e->be->write(e->ctx, st->dst, buf, n * 4);
        free(buf);
    }
}

/* TP collectives overlap the compute that does not read them: a
 * CG_STEP_TP step starts its collective (rt_comm_tp_start: the operand is
 * copied at once, so memplan may reuse it), and the first later step that
 * reads its result's storage waits for it (memplan keeps that storage
 * live from the TP step to its last reader, so no step writes it in
 * between); the ones that no step reads (graph outputs) land before
 * rt_exec_run returns. The schedule pass puts independent work there,
 * the weight-gradient GEMMs under backward's all-reduces.
 *
 * On the device (BackendExt.tp_wait) the collective reads its operand in
 * place while the compute stream goes on. memplan may reuse the operand's
 * bytes once the TP step (its last reader) is past: where a step before
 * the wait writes them, the backend copies the operand at the TP step for
 * the collective to read (BackendExt.tp_operand_copy), or, without that
 * hook, the wait moves up to that step. A step that a GEMM's epilogue computes
 * (CgStep.by_epilogue) reads and writes at that GEMM's step. The backend
 * waits for the rest at the end of the run. */

/* The step whose work runs step k's reads and writes on the device: the
 * GEMM whose epilogue replaces k when that GEMM comes after step s (the
 * TP step), else k. */
static int dev_step(const CgPlan *p, int k, int s)
{
    int by = p->steps.v[k].by_epilogue;
    return by > s && by < k && p->steps.v[by].kind == CG_STEP_GEMM ? by : k;
}

static bool overlaps(int64_t a, int64_t na, int64_t b, int64_t nb)
{
    return a < b + nb && b < a + na;
}

/* The first step after TP step s that writes bytes of storage `root` on
 * the device (an op's result, an update copy, a shard_pack), n if none. */
static int first_writer(const Exec *e, const int *ostep, int s, int root)
{
    const CgPlan *p = e->plan;
    const MemPlan *m = p->mem;
    const Graph *g = e->g;
    int64_t off = m->offset[root], nb = m->bytes[root];
    int first = p->steps.n;
    for (int i = 0; i < g->ops.n; i++) {
        int r = m->root[g->ops.v[i].out];
        if (ostep[i] > s && overlaps(m->offset[r], m->bytes[r], off, nb) &&
            dev_step(p, ostep[i], s) < first)
            first = dev_step(p, ostep[i], s);
    }
    for (int k = s + 1; k < first; k++) {
        const CgStep *st = &p->steps.v[k];
        if ((st->kind == CG_STEP_COPY && overlaps(st->dst, st->bytes, off, nb)) ||
            (st->kind == CG_STEP_SHARD_PACK && st->sh_buf >= 0 &&
             overlaps(m->offset[st->sh_buf], m->bytes[st->sh_buf], off, nb)))
            first = k;
    }
    return first;
}

/* tp_wait_head and tp_wait_next: where each TP step's collective is waited
 * for (above); device: the backend's placement (BackendExt.tp_wait), else
 * the host's (start_tp, wait_tp). */
static bool setup_tp_waits(Exec *e, bool device, Diag *d)
{
    const CgPlan *p = e->plan;
    const Graph *g = e->g;
    int n = p->steps.n;
    bool any = false;
    for (int s = 0; s < n && !any; s++)
        any = p->steps.v[s].kind == CG_STEP_TP;
    if (!any)
        return true;
    if (!device)
        e->tp_handle = xmalloc(sizeof(int) * (size_t)(n + 1));
    e->tp_wait_head = xmalloc(sizeof(int) * (size_t)(n + 1));
    e->tp_wait_next = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int s = 0; s < n; s++) {
        if (!device)
            e->tp_handle[s] = -1;
        e->tp_wait_head[s] = e->tp_wait_next[s] = -1;
    }
    const MemPlan *m = p->mem;
    int *ostep = cg_plan_op_steps(e->plan, e->g);
    int ntp = 0, nover = 0, under = 0, held = 0, copied = 0; /* verbose: the overlap */
    const BackendExt *x = e->be->ext;
    for (int s = 0; s < n; s++) {
        if (p->steps.v[s].kind != CG_STEP_TP)
            continue;
        const Op *op = &g->ops.v[p->steps.v[s].op];
        int root = m->root[op->out], xroot = m->root[op->in[0]], first = n;
        for (int i = 0; i < g->ops.n; i++)
            for (int j = 0; j < g->ops.v[i].nin; j++)
                if (ostep[i] > s && m->root[g->ops.v[i].in[j]] == root) {
                    int k = device ? dev_step(p, ostep[i], s) : ostep[i];
                    first = k < first ? k : first;
                }
        if (e->o.tp_no_overlap && first > s + 1) /* tp_overlap=false */
            first = s + 1;
        if (device && xroot != root) {
            int w = first_writer(e, ostep, s, xroot);
            if (w < first && x->tp_operand_copy) { /* the collective reads a copy */
                if (!x->tp_operand_copy(e->ctx, s, first, d)) {
                    free(ostep);
                    return false;
                }
                copied++;
            } else if (w < first) {
                held++;
                first = w;
            }
        }
        ntp++;
        nover += first > s + 1;
        under += first - s - 1;
        if (first < n) {
            e->tp_wait_next[s] = e->tp_wait_head[first];
            e->tp_wait_head[first] = s;
        }
    }
    free(ostep);
    if (device && e->o.verbose)
        fprintf(stderr,
                "kiln: exec: %d TP collectives on the device, %d of them under later steps "
                "(%d steps in all; %d read a copy of an operand whose bytes a step before the "
                "reader reuses, %d wait before that step instead)\n",
                ntp, nover, under, copied, held);
    else if (e->o.verbose)
        fprintf(stderr,
                "kiln: exec: %d TP collectives on the host, %d of them under later steps "
                "(%d steps in all)%s\n",
                ntp, nover, under, e->o.tp_no_overlap ? " (tp_overlap=false)" : "");
    return true;
}

/* A CG_STEP_TP step: starts its op's collective over the TP group, from
 * the operand's buffer to the result's, in host memory (setup_tp refuses
 * TP steps on a backend with neither host pointers nor TP collectives). */
static void start_tp(Exec *e, int s)
{
    const CgStep *st = &e->plan->steps.v[s];
    const Graph *g = e->plan->g;
    const Op *op = &g->ops.v[st->op];
    const Shape *xs = &g->t.v[op->in[0]].s, *ys = &g->t.v[op->out].s;
    int64_t nx = shape_numel(xs), ny = shape_numel(ys);
    if (!e->o.tp_comm)
        die("start_tp: %s without a TP group (rt_dp_open refuses tp > 1 on one rank)",
            ir_opinfo[op->code].name);
    if (xs->dtype != DT_F32)
        die("start_tp: %s of %s (the partition pass runs on f32 graphs only)",
            ir_opinfo[op->code].name, dtype_name(xs->dtype));
    float *x = e->be->host_ptr(e->ctx, st->src), *y = e->be->host_ptr(e->ctx, st->dst);
    int64_t outer = 1;
    for (int i = 0; i < op->attr.ia[0] && i < xs->rank; i++)
        outer *= xs->dim[i];
    int h;
    switch (op->code) {
    case OP_TP_ALLREDUCE: h = rt_comm_tp_start(e->o.tp_comm, 0, x, 1, ny, y); break;
    case OP_TP_ALL_GATHER: h = rt_comm_tp_start(e->o.tp_comm, 2, x, outer, nx / outer, y); break;
    case OP_TP_REDUCE_SCATTER:
        h = rt_comm_tp_start(e->o.tp_comm, 1, x, outer, ny / outer, y);
        break;
    default: die("start_tp: %s", ir_opinfo[op->code].name);
    }
    e->tp_handle[s] = h;
    e->tp_inflight += h >= 0;
}

static void wait_tp(Exec *e, int s)
{
    if (e->tp_handle[s] < 0)
        return;
    rt_comm_tp_wait(e->o.tp_comm, e->tp_handle[s]);
    e->tp_handle[s] = -1;
    e->tp_inflight--;
}

/* Every TP collective still in flight lands (the end of a run). */
static void wait_tp_all(Exec *e)
{
    for (int s = 0; e->tp_inflight > 0 && s < e->plan->steps.n; s++)
        wait_tp(e, s);
}

/* Plan step s: allreduce starts and waits go to the communication thread
 * (or the backend's device collectives, shard_pack included), everything
 * else to the backend. */
static bool run_step(Exec *e, int s, uint64_t seed, int64_t step, Diag *d)
{
    const CgStep *st = &e->plan->steps.v[s];
    /* device TP collectives whose result this step reads, or (without an
     * operand copy) whose operand's bytes it overwrites (setup_tp_waits) */
    for (int t = e->dev_tp && e->tp_wait_head ? e->tp_wait_head[s] : -1; t >= 0;
         t = e->tp_wait_next[t])
        if (!e->be->ext->tp_wait(e->ctx, t, d))
            return false;
    for (int h = e->hook_at ? e->hook_at[s] : -1; h >= 0; h = e->hooks.v[h].next)
        e->hooks.v[h].fn(e->hooks.v[h].arg, e->hooks.v[h].id);
    for (int b = e->wait_head ? e->wait_head[s] : -1; b >= 0; b = e->wait_next[b])
        wait_bucket(e, b);
    if (e->deferred && e->deferred[s]) { /* waited for by the next run's readers */
        e->pending[st->bucket] = true;
        return e->dev_comm ? e->be->run_step(e->ctx, s, seed, step, d) : true; /* events */
    }
    if (st->kind == CG_STEP_SHARD_PACK && !e->dev_comm) {
        shard_pack(e, st);
        return true;
    }
    if (e->tp_inflight > 0) {
        rt_comm_tp_poll(e->o.tp_comm);
        for (int t = e->tp_wait_head[s]; t >= 0; t = e->tp_wait_next[t])
            wait_tp(e, t);
    }
    if (st->kind == CG_STEP_TP && e->dev_tp)
        return e->be->ext->tp_run(e->ctx, s, d);
    if (st->kind == CG_STEP_TP) {
        e->be->sync(e->ctx);
        start_tp(e, s);
        return true;
    }
    if (st->kind == CG_STEP_ALLREDUCE_START) {
        if (e->dev_comm)
            return e->be->ext->allreduce_start(e->ctx, s, d);
        rt_comm_start(e->o.comm, e->plan, s, e->be, e->ctx);
        if (st->coll == CG_COLL_ALL_GATHER && s <= e->release_at)
            rt_comm_release(e->o.comm);
        return true;
    }
    if (st->kind == CG_STEP_ALLREDUCE_WAIT) {
        if (e->dev_comm)
            return e->be->ext->allreduce_wait(e->ctx, s, d);
        rt_comm_wait(e->o.comm, st->bucket);
        return true;
    }
    return e->be->run_step(e->ctx, s, seed, step, d);
}

static void setup_profile(Exec *e)
{
    const CgPlan *p = e->plan;
    int n = p->steps.n;
    e->row_of = xmalloc(sizeof(int) * (size_t)(n + 1));
    e->trace = xcalloc((size_t)n + 1, sizeof(RtTraceEvent));
    e->step_flops = xcalloc((size_t)n + 1, sizeof(double));
    e->step_bytes = xcalloc((size_t)n + 1, sizeof(double));
    for (int s = 0; s < n; s++) {
        const CgStep *st = &p->steps.v[s];
        const char *kind = step_kind(st->kind);
        const char *name = cg_step_key(p, s); /* a GEMM's: gemm_op<N> */
        e->step_flops[s] = st->flops;
        e->step_bytes[s] = st->bytes_moved;
        e->trace[s] = (RtTraceEvent){name, kind, st->op, 0, 0};
        int r = -1;
        for (int q = 0; q < e->rows.n && r < 0; q++)
            if (e->rows.v[q].name == name && e->rows.v[q].kind == kind)
                r = q;
        if (r < 0) {
            RtProfRow row = {name, kind, 0, 0, 0, 0, s};
            vec_push(&e->rows, row);
            r = e->rows.n - 1;
        }
        e->row_of[s] = r;
    }
    e->dev_prof = e->be->ext && e->be->ext->step_times;
    if (e->dev_prof) {
        e->dev_start = xcalloc((size_t)n + 1, sizeof(double));
        e->dev_end = xcalloc((size_t)n + 1, sizeof(double));
    }
}

static bool bcast_ranks(void *arg, void *buf, size_t n)
{
    rt_comm_bcast(arg, buf, n);
    return true;
}

static void lost_ranks(void *arg, const char *what)
{
    rt_comm_lost(arg, what);
}

static bool bcast_tp(void *arg, void *buf, size_t n)
{
    rt_comm_tp_bcast(arg, buf, n);
    return true;
}

/* RtComm's source of device collectives (rt_comm_set_source). */
static void pull_comm(void *arg, RtComm *c)
{
    Exec *e = arg;
    double exposed = 0;
    int n = e->be->ext->comm_events(e->ctx, e->cev, e->ncev, &exposed);
    rt_comm_add_events(c, e->cev, n, exposed);
}

/* Hands the plan's collectives to the device when the backend runs them
 * there: every rank's executor of a plan with allreduce steps calls it, in
 * the same order (it is collective over the ranks). */
static bool setup_comm(Exec *e, Diag *d)
{
    const CgPlan *p = e->plan;
    int nb = 0;
    bool any = false;
    /* sharded steps (zero=1) need the plan's rank count, and run on the
     * communication thread on every backend (through its read and write) */
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        bool sharded = st->kind == CG_STEP_SHARD_PACK ||
                       (st->kind == CG_STEP_ALLREDUCE_START && st->coll != CG_COLL_ALLREDUCE);
        if (sharded && st->sh_nranks != rt_comm_size(e->o.comm)) {
            snprintf(d->msg, sizeof d->msg,
                     "the step shards the optimizer state over %d ranks (zero=1), but this "
                     "run has %d (expected the same --nproc as the compiled step)",
                     st->sh_nranks, rt_comm_size(e->o.comm));
            return false;
        }
        if (sharded && !e->be->host && !(e->be->ext && e->be->ext->comm_setup)) {
            snprintf(d->msg, sizeof d->msg,
                     "zero=1 (sharded optimizer state) needs a backend that runs its "
                     "collectives (expected --device cpu or cuda, got the %s backend)",
                     e->be->name);
            return false;
        }
        /* A sharded plan is settled here: every one of its collectives
         * (the reduce-scatters, the norm's scalar all-reduce, the
         * all-gathers) runs on the communication thread through the host
         * backend's read and write (refused above on any other), so none is
         * handed to device collectives below, and every sharded step of
         * the plan carries the one rank count the optimizer pass gave them
         * all (pass_optimizer: one flat order, one shard geometry). */
        if (sharded) {
            if (rt_comm_size(e->o.comm) > 1)
                setup_defer(e);
            break; /* a device backend runs the sharded steps too (below) */
        }
    }
    for (int s = 0; s < p->steps.n; s++)
        if (p->steps.v[s].kind == CG_STEP_ALLREDUCE_START) {
            any = true;
            if (p->steps.v[s].bucket + 1 > nb)
                nb = p->steps.v[s].bucket + 1;
        }
    const BackendExt *x = e->be->ext;
    if (!any || !x || !x->comm_setup)
        return true;
    RtComm *c = e->o.comm;
    bool many = rt_comm_size(c) > 1;
    RtCommGroup g = {.rank = rt_comm_rank(c),
                     .size = rt_comm_size(c),
                     .local_rank = rt_comm_local_rank(c),
                     .bcast = many ? bcast_ranks : NULL,
                     .arg = c,
                     .timeout = many ? rt_comm_timeout(c) : 0,
                     .lost = many ? lost_ranks : NULL};
    if (!x->comm_setup(e->ctx, &g, d))
        return false;
    e->dev_comm = true;
    if (x->comm_events && c) {
        e->ncev = 2 * nb; /* zero=1: a gather carried from the last run, too */
        e->cev = xcalloc((size_t)e->ncev + 1, sizeof(RtCommEvent));
        rt_comm_set_source(c, pull_comm, e);
    }
    return true;
}

/* The executor's TP collectives run by the device (rt_comm_tp_source). */
static void pull_tp(void *arg, RtComm *c)
{
    Exec *e = arg;
    rt_comm_tp_add_events(c, e->tpev, e->be->ext->tp_events(e->ctx, e->tpev, e->ntpev));
}

/* A plan with TP steps: on a backend with TP collectives of its own
 * (BackendExt.tp_setup; collective over the TP group) they run there;
 * else on the host (start_tp), which needs host pointers. */
static bool setup_tp(Exec *e, Diag *d)
{
    const CgPlan *p = e->plan;
    int first = -1, n = 0;
    for (int s = 0; s < p->steps.n; s++)
        if (p->steps.v[s].kind == CG_STEP_TP) {
            first = first < 0 ? s : first;
            n++;
        }
    if (first < 0)
        return true;
    const BackendExt *x = e->be->ext;
    RtComm *c = e->o.tp_comm;
    if (x && x->tp_setup && x->tp_run && c) {
        bool many = rt_comm_tp(c) > 1;
        RtCommGroup g = {.rank = rt_comm_tp_rank(c),
                         .size = rt_comm_tp(c),
                         .local_rank = rt_comm_local_rank(c),
                         .bcast = many ? bcast_tp : NULL,
                         .arg = c,
                         .timeout = many ? rt_comm_timeout(c) : 0,
                         .lost = many ? lost_ranks : NULL};
        if (!x->tp_setup(e->ctx, &g, d))
            return false;
        e->dev_tp = true;
        if (x->tp_wait && !setup_tp_waits(e, true, d)) /* else the backend waits at once */
            return false;
        if (x->tp_events) {
            e->ntpev = n;
            e->tpev = xcalloc((size_t)n + 1, sizeof(RtCommEvent));
            rt_comm_tp_source(c, pull_tp, e);
        }
        return true;
    }
    if (!e->be->host_ptr) {
        const Op *op = &p->g->ops.v[p->steps.v[first].op];
        snprintf(d->msg, sizeof d->msg,
                 "%s:%d: tensor parallelism needs a backend that runs its collectives "
                 "(expected --device cpu or cuda with tp > 1, got the %s backend)",
                 op->loc.file ? op->loc.file : "?", op->loc.line, e->be->name);
        return false;
    }
    return setup_tp_waits(e, false, d);
}

static int64_t nbytes(const Exec *e, int t);

static bool bcast_pp(void *arg, void *buf, size_t n)
{
    rt_comm_pp_bcast(arg, 0, buf, n);
    return true;
}

int rt_exec_pp_setup(Exec *e, RtComm *c, Diag *d)
{
    const BackendExt *x = e->be->ext;
    if (!x || !x->pp_setup || !x->pp_xfer || rt_comm_pp(c) < 2)
        return 0;
    RtCommGroup g = {.rank = rt_comm_pp_stage(c),
                     .size = rt_comm_pp(c),
                     .local_rank = rt_comm_local_rank(c),
                     .bcast = bcast_pp,
                     .arg = c,
                     .timeout = rt_comm_timeout(c),
                     .lost = lost_ranks};
    if (!x->pp_setup(e->ctx, &g, d))
        return -1;
    e->dev_pp = true;
    return 1;
}

bool rt_exec_pp_xfer(Exec *e, bool send, int peer, int tensor, Diag *d)
{
    if (!e->dev_pp)
        die("rt_exec_pp_xfer: no rt_exec_pp_setup");
    if (tensor >= e->g->t.n)
        die("rt_exec_pp_xfer: no tensor %%%d", tensor);
    if (tensor < 0)
        return e->be->ext->pp_xfer(e->ctx, send, peer, -1, -tensor, d);
    return e->be->ext->pp_xfer(e->ctx, send, peer, cg_offset(e->plan, tensor), nbytes(e, tensor),
                               d);
}

/* False, with both sizes in d, when the plan's arena (persistent buffers and
 * temporaries) is larger than this machine's physical memory: checked before
 * the backend allocates anything. Only for a backend whose arena is host
 * memory (Backend.host); a device backend reports its own allocation
 * failure. */
static bool arena_fits(const Backend *be, const CgPlan *p, Diag *d)
{
    if (!be->host)
        return true;
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || psize <= 0)
        return true; /* unknown: let the allocation decide */
    int64_t mem = ir_mul_sat(pages, psize);
    if (p->arena_bytes <= mem)
        return true;
    char need[64], have[64];
    ir_fmt_bytes((double)p->arena_bytes, 1, need, sizeof need);
    ir_fmt_bytes((double)mem, 1, have, sizeof have);
    snprintf(d->msg, sizeof d->msg,
             "the plan needs %s%s but this machine has %s of memory (expected an arena of at "
             "most %lld bytes, got %lld: make the model or batch smaller, or set "
             "--memory-budget)",
             p->arena_bytes == INT64_MAX ? "more than " : "", need, have, (long long)mem,
             (long long)p->arena_bytes);
    return false;
}

Exec *rt_exec_create(const Graph *g, const ExecOpts *o, Diag *d)
{
    static const ExecOpts defaults;
    if (!o)
        o = &defaults;
    const Backend *be = rt_backend_select(o->device, o->verbose, d);
    if (!be)
        return NULL;
    Exec *e = xcalloc(1, sizeof *e);
    e->o = *o;
    e->g = ir_clone(g);
    e->be = be;
    e->plan = cg_plan(e->g, d);
    e->release_at = -1;
    if (!e->plan)
        goto fail;
    ExecOpts bo = *o; /* what the backend gets */
    bo.host_arena = NULL;
    const Exec *h = o->arena_of;
    if (h && h->be == be && be->host && be->host_ptr && !h->arena_of) {
        const MemPlan *hm = h->plan->mem;
        if (e->plan->arena_bytes <= hm->arena_bytes - hm->persistent_bytes) {
            bo.host_arena = be->host_ptr(h->ctx, hm->persistent_bytes);
            e->arena_of = o->arena_of;
        }
    }
    e->o.host_arena = bo.host_arena;
    if (!bo.host_arena && !arena_fits(be, e->plan, d))
        goto fail;
    /* zero=1: the update in pieces (the CPU runs a piece through NAME_range, the
     * CUDA backend through the kernel's range function, CgCudaProgram.step_range) */
    if (rt_comm_size(o->comm) > 1)
        e->release_at = rt_pieces_plan(e->plan, rt_comm_rank(o->comm), rt_comm_size(o->comm));
    e->ctx = be->create(e->plan, &bo, d);
    if (!e->ctx)
        goto fail;
    if (!be->host) { /* a device backend's code: the CUDA module's cubins */
        char *root = rt_cache_path(o->cache_dir), *cubins = xasprintf("%s/cuda", root);
        rt_cache_prune(cubins, "", NULL, o->verbose);
        free(cubins);
        free(root);
    }
    if (!setup_comm(e, d))
        goto fail;
    if (!setup_tp(e, d))
        goto fail;
    if (o->profile)
        setup_profile(e);
    if (o->verbose)
        fprintf(stderr, "kiln: exec: %s, %d steps, %d kernels, arena %lld bytes\n", be->name,
                e->plan->steps.n, e->plan->kernels.n, (long long)e->plan->arena_bytes);
    if (o->verbose && e->release_at >= 0) {
        int np = 0;
        for (int s = 0; s < e->plan->steps.n; s++)
            np += e->plan->steps.v[s].kind == CG_STEP_KERNEL &&
                  e->plan->steps.v[s].hi > e->plan->steps.v[s].lo;
        fprintf(stderr, "kiln: exec: zero=1: rank %d runs the update in %d piece%s\n",
                rt_comm_rank(o->comm), np, np == 1 ? "" : "s");
    }
    return e;
fail:
    rt_exec_destroy(e);
    return NULL;
}

/* Nothing of e's last run in flight: its deferred gathers landed, and (on
 * the CPU) their sends, which read the arena, ended. */
static void settle(Exec *e);
void rt_exec_settle(Exec *e) { settle(e); }

static void settle(Exec *e)
{
    for (int b = 0; e->pending && b < e->nb; b++)
        wait_bucket(e, b);
    /* zero=1 on the CPU: the owner's gathers send from the arena and are
     * settled before their sends end (mpi.c); the arena outlives them */
    if (e->pending && !e->dev_comm)
        rt_comm_drain(e->o.comm);
}

void rt_exec_destroy(Exec *e)
{
    if (!e)
        return;
    settle(e);
    free(e->first_reader);
    free(e->pending);
    free(e->deferred);
    free(e->root_bucket);
    free(e->wait_head);
    free(e->wait_next);
    free(e->tp_handle);
    free(e->tp_wait_head);
    free(e->tp_wait_next);
    vec_free(&e->hooks);
    free(e->hook_at);
    if (e->cev)
        rt_comm_set_source(e->o.comm, NULL, e);
    if (e->tpev)
        rt_comm_tp_source(e->o.tp_comm, NULL, e);
    if (e->ctx)
        e->be->destroy(e->ctx);
    cg_plan_free(e->plan);
    ir_free(e->g);
    free(e->row_of);
    vec_free(&e->rows);
    free(e->sorted);
    free(e->trace);
    free(e->step_flops);
    free(e->step_bytes);
    free(e->dev_start);
    free(e->dev_end);
    free(e->cev);
    free(e->tpev);
    free(e);
}

static int64_t nbytes(const Exec *e, int t)
{
    const Tensor *x = &e->g->t.v[t];
    return shape_bytes(&x->s);
}

void rt_exec_write(Exec *e, int tensor, const void *src)
{
    if (tensor < 0 || tensor >= e->g->t.n)
        die("rt_exec_write: no tensor %%%d", tensor);
    if (e->root_bucket && e->root_bucket[e->plan->mem->root[tensor]] >= 0) {
        int b = e->root_bucket[e->plan->mem->root[tensor]];
        wait_bucket(e, b);
        if (!e->dev_comm) /* its sends may still read these bytes (mpi.c) */
            rt_comm_wait_done(e->o.comm, b);
    }
    e->be->write(e->ctx, cg_offset(e->plan, tensor), src, nbytes(e, tensor));
}

void rt_exec_read(Exec *e, int tensor, void *dst)
{
    if (tensor < 0 || tensor >= e->g->t.n)
        die("rt_exec_read: no tensor %%%d", tensor);
    if (e->root_bucket && e->root_bucket[e->plan->mem->root[tensor]] >= 0)
        wait_bucket(e, e->root_bucket[e->plan->mem->root[tensor]]);
    e->be->read(e->ctx, cg_offset(e->plan, tensor), dst, nbytes(e, tensor));
}

/* Plan step s of the last run took [a, b) (seconds since the run began). */
static void account(Exec *e, int s, double a, double b)
{
    e->trace[s].start = a;
    e->trace[s].end = b;
    RtProfRow *r = &e->rows.v[e->row_of[s]];
    r->calls++;
    r->seconds += b - a;
    r->flops += e->step_flops[s];
    r->bytes += e->step_bytes[s];
}

static bool exec_run(Exec *e, uint64_t seed, int64_t step, Diag *d)
{
    const CgPlan *p = e->plan;
    if (e->arena_of) /* its temp region is ours now */
        settle(e->arena_of);
    if (!e->o.profile) {
        for (int s = 0; s < p->steps.n; s++)
            if (!run_step(e, s, seed, step, d))
                return false;
        return true;
    }
    if (e->dev_prof) {
        for (int s = 0; s < p->steps.n; s++)
            if (!run_step(e, s, seed, step, d))
                return false;
        if (e->be->ext->step_times(e->ctx, e->dev_start, e->dev_end)) {
            for (int s = 0; s < p->steps.n; s++)
                account(e, s, e->dev_start[s], e->dev_end[s]);
        } else {
            e->dev_prof = false; /* this run is not counted; later ones are timed on the host */
        }
        return true;
    }
    double t0 = ir_now();
    for (int s = 0; s < p->steps.n; s++) {
        double a = ir_now();
        if (!run_step(e, s, seed, step, d))
            return false;
        e->be->sync(e->ctx);
        double b = ir_now();
        account(e, s, a - t0, b - t0);
    }
    return true;
}

bool rt_exec_run(Exec *e, uint64_t seed, int64_t step, Diag *d)
{
    bool ok = exec_run(e, seed, step, d);
    if (e->tp_inflight > 0) /* on failure too: MPI may not keep writing into the arena */
        wait_tp_all(e);
    return ok;
}

double rt_exec_device_seconds(Exec *e)
{
    const BackendExt *x = e->be->ext;
    return x && x->run_seconds ? x->run_seconds(e->ctx) : -1;
}

int64_t rt_exec_arena_bytes(const Exec *e)
{
    const BackendExt *x = e->be->ext;
    return x && x->arena_bytes ? x->arena_bytes(e->ctx) : e->plan->arena_bytes;
}

bool rt_exec_arena_shared(const Exec *e) { return e->arena_of != NULL; }

void *rt_exec_host_view(Exec *e, int tensor)
{
    if (tensor < 0 || tensor >= e->g->t.n)
        die("rt_exec_host_view: no tensor %%%d", tensor);
    if (!e->be->host || !e->be->host_ptr || e->arena_of)
        return NULL;
    return e->be->host_ptr(e->ctx, cg_offset(e->plan, tensor));
}

const struct CgPlan *rt_exec_plan(const Exec *e) { return e->plan; }

const char *rt_exec_device(const Exec *e) { return e->be->name; }

bool rt_exec_device_info(const Exec *e, RtDeviceInfo *out)
{
    const BackendExt *x = e->be->ext;
    memset(out, 0, sizeof *out);
    return x && x->device_info && x->device_info(e->ctx, out);
}

static int cmp_row(const void *a, const void *b)
{
    const RtProfRow *x = a, *y = b;
    return x->seconds > y->seconds ? -1 : x->seconds < y->seconds;
}

int rt_exec_profile(Exec *e, const RtProfRow **rows)
{
    free(e->sorted);
    e->sorted = xmalloc(sizeof(RtProfRow) * (size_t)(e->rows.n + 1));
    if (e->rows.n)
        memcpy(e->sorted, e->rows.v, sizeof(RtProfRow) * (size_t)e->rows.n);
    qsort(e->sorted, (size_t)e->rows.n, sizeof(RtProfRow), cmp_row);
    *rows = e->sorted;
    return e->rows.n;
}

void rt_exec_profile_reset(Exec *e)
{
    for (int i = 0; i < e->rows.n; i++) {
        e->rows.v[i].calls = 0;
        e->rows.v[i].seconds = e->rows.v[i].flops = e->rows.v[i].bytes = 0;
    }
}

int rt_exec_trace(const Exec *e, const RtTraceEvent **ev)
{
    *ev = e->trace;
    return e->trace ? e->plan->steps.n : 0;
}

/* Writes text to path; on a failure (a full disk) says so in d and leaves
 * no truncated file. */
static bool dump_file(const char *path, const char *text, Diag *d)
{
    FILE *f = fopen(path, "w");
    bool wrote = f && fputs(text, f) != EOF;
    int err = errno;
    if (f && fclose(f) != 0 && wrote)
        wrote = false, err = errno;
    if (!wrote) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", path, strerror(err ? err : EIO));
        struct stat st;
        if (f && lstat(path, &st) == 0 && S_ISREG(st.st_mode))
            unlink(path);
    }
    return wrote;
}

bool rt_dump_kernels(const Graph *g, const char *dir, Diag *d)
{
    CgPlan *p = cg_plan(g, d);
    if (!p)
        return false;
    char *kd = xasprintf("%s/kernels", dir);
    mkdir(kd, 0777);
    bool ok = true;
    for (int i = 0; i < p->kernels.n && ok; i++) {
        const CgKernel *k = p->kernels.v[i];
        for (int cuda = 0; cuda < 2 && ok; cuda++) {
            CgBuf b = {0};
            if (!cuda) {
                cg_puts(&b, cg_c_prelude);
                cg_puts(&b, cg_c_attn_helpers); /* the attention kernels' helper */
                cg_print_c_kernel(&b, k);
            } else {
                CgCudaFn *fn = NULL;
                cg_puts(&b, cg_cuda_prelude);
                if (k->attn.kind != CG_ATTN_NONE) {
                    cg_puts(&b, cg_cuda_attn_lib);
                    cg_puts(&b, cg_cuda_attn_bwd_lib);
                }
                int nfn = cg_print_cuda_kernel(&b, k, k->name, NULL, &fn);
                cg_cuda_fns_free(fn, nfn);
            }
            char *path = xasprintf("%s/%s.%s", kd, k->name, cuda ? "cu" : "c");
            ok = dump_file(path, b.s, d);
            free(path);
            free(b.s);
        }
    }
    /* the CUDA program as the device compiles it (every variant, f32 and
     * bf16 storage), beside kernels/ (one source per kernel there) */
    for (int bf = 0; bf < 2 && ok; bf++) {
        CgCudaProgram *q = cg_cuda_program(p, bf != 0);
        char *path = xasprintf("%s/program%s.cu", dir, bf ? "-bf16" : "");
        ok = dump_file(path, q->source, d);
        free(path);
        cg_cuda_program_free(q);
    }
    free(kd);
    cg_plan_free(p);
    return ok;
}
