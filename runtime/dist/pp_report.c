/* pp_report.c - what the pipeline shows (dist.h, rt_pp_print,
 * rt_pp_trace, rt_pp_summary): the stage cut and the (capped) schedule
 * table, the stages' F, B and W in the Chrome trace, and the summary's
 * pipeline lines (busy and waiting time, the measured bubble, memory).
 * The pipeline's state: pp_internal.h. */
#include "pp_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

void rt_pp_print(const RtPp *p, FILE *f)
{
    pass_stage_cut_print(p->fwd, &p->cut, f);
    pass_stage_schedule_print_capped(p->sched, p->n, p->m, p->wcap, f);
    for (int s = 0; p->wcap && s < p->n; s++)
        if (p->wcap[s] < s)
            fprintf(f, "# zb-h1 memory cap: stage %d keeps at most %d W's waiting (the table's "
                    "%d would hold more than %.2f x 1f1b's peak)\n", s, p->wcap[s], s,
                    CG_ZBH1_MEM);
}

/* ---- the trace and the summary ------------------------------------------- */

void rt_pp_trace(const RtPp *p, Trace *trace, double t0)
{
    if (!p || !trace)
        return;
    char name[64];
    snprintf(name, sizeof name, "pipeline stage %d (first steps)", p->s);
    rt_trace_thread_name(trace, 6, name);
    for (int i = 0; i < p->ev.n; i++) {
        const PpEvent *e = &p->ev.v[i];
        if (e->kind == 'r')
            snprintf(name, sizeof name, "recv %d", e->mb);
        else
            snprintf(name, sizeof name, "%c%d", e->kind, e->mb);
        rt_trace_event(trace, name, e->kind == 'r' ? "comm" : "pipeline", 1e6 * (e->start - t0),
                       1e6 * (e->end - e->start), 6);
    }
}

/* This process's resident peak (getrusage; 0 where unknown). */
static double peak_resident(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? 1024.0 * (double)ru.ru_maxrss : 0;
}

void rt_pp_summary(const RtPp *p, FILE *f)
{
    if (!p || p->busy.n == 0)
        return;
    /* every stage's figures, summed over the pipeline (each fills its own):
     * medians of busy, waiting and idle share; the micro-batches held, the
     * bytes they hold, the programs' arenas, the resident peak */
    enum { NV = 7 };
    double *v = xcalloc((size_t)(NV * p->n + 1), sizeof(double)), *x = v + NV * p->s;
    x[0] = 1e3 * ir_median(p->busy.v, p->busy.n);
    x[1] = 1e3 * ir_median(p->wait.v, p->wait.n);
    x[2] = ir_median(p->idle.v, p->idle.n);
    x[3] = p->nslot[H_W];
    x[4] = (double)p->nslot[H_B] * (double)p->rec + (double)p->nslot[H_W] * (double)p->recw +
           (double)p->nslot[p->xin] * (double)p->recv_off[p->nrecv] +
           (double)p->nslot[p->gin] * (double)p->send_off[p->nsend];
    for (int i = 0; i < P__N; i++)
        x[5] += p->pr[i].e ? (double)rt_exec_arena_bytes(p->pr[i].e) : 0;
    x[6] = peak_resident();
    rt_comm_pp_sum(p->comm, v, NV * p->n);
    fprintf(f, "pipeline: pp = %d, %d micro-batches, %s | per step (median of %d), running F, "
            "B and W / waiting in receives:", p->n, p->m, pass_stage_schedule_name(p->sched),
            p->busy.n);
    for (int s = 0; s < p->n; s++) {
        double tot = v[NV * s] + v[NV * s + 1];
        fprintf(f, "%s stage %d %.2f / %.2f ms (%.0f%% waiting)", s ? " |" : "", s, v[NV * s],
                v[NV * s + 1], tot > 0 ? 100.0 * v[NV * s + 1] / tot : 0);
    }
    fputc('\n', f);
    double mean = 0;
    for (int s = 0; s < p->n; s++)
        mean += v[NV * s + 2] / p->n;
    fprintf(f, "pipeline bubble: idle share of the pipeline's span per step (median), "
            "measured:");
    for (int s = 0; s < p->n; s++)
        fprintf(f, " stage %d %.1f%%", s, 100.0 * v[NV * s + 2]);
    fprintf(f, ", mean %.1f%% | formulas: 1f1b (p-1)/(m+p-1) %.1f%%, zb-h1 (p-1)/(3m+p-1) "
            "%.1f%%\n", 100.0 * mean, 100.0 * (p->n - 1) / (p->m + p->n - 1),
            100.0 * (p->n - 1) / (3 * p->m + p->n - 1));
    if (p->tstage) {
        fprintf(f, "pipeline: cut by measured time (--pp-balance time), F, B and W of one "
                "micro-batch on one CPU thread:");
        for (int s = 0; s < p->n; s++)
            fprintf(f, "%s stage %d %.2f ms", s ? " |" : "", s, 1e3 * p->tstage[s]);
        fputc('\n', f);
    }
    fprintf(f, "pipeline memory:");
    for (int s = 0; s < p->n; s++) {
        char h[32], ar[32], rs[32];
        ir_fmt_bytes(v[NV * s + 4], 2, h, sizeof h);
        ir_fmt_bytes(v[NV * s + 5], 2, ar, sizeof ar);
        ir_fmt_bytes(v[NV * s + 6], 2, rs, sizeof rs);
        fprintf(f, "%s stage %d holds %.0f micro-batches (%s), F/B/W arenas %s, peak resident %s",
                s ? " |" : "", s, v[NV * s + 3], h, ar, rs);
    }
    fputc('\n', f);
    if (p->remat_on)
    {
        fprintf(f, "pipeline: remat | stage %d recomputes %d of its %d saved activations "
                "(%d ops); stashed per micro-batch %.2f KiB (without remat %.2f KiB)", p->s,
                p->remat.nrecomputed, p->remat.nsaved, p->remat.nrecompute_ops,
                (double)p->rec / 1024.0, (double)p->rec_plain / 1024.0);
        if (p->remat.peak >= 0)
            fprintf(f, "; planned peak of one micro-batch's F, B and W as one program "
                    "%.2f KiB", (double)p->remat.peak / 1024.0);
        fputc('\n', f);
    }
    if (p->shard > 0) {
        int64_t all = 0;
        for (int i = 0; i < p->ps.n; i++)
            all += p->ps.v[i].numel;
        fprintf(f, "pipeline: zero = 1 | stage %d's AdamW state sharded over its %d dp ranks: "
                "adam.m and adam.v f32[%lld] per rank (the stage's params: %lld)\n", p->s,
                rt_comm_size(p->comm), (long long)p->shard, (long long)all);
    }
    if (p->dpms.n > 0)
        fprintf(f, "pipeline: dp = %d | the gradients' mean over dp after the micro-batches "
                "(%s, blocking, all exposed): %.2f ms per step (median, stage %d)\n",
                rt_comm_size(p->comm), p->gshard >= 0 ? "reduce-scatter" : "all-reduce",
                ir_median(p->dpms.v, p->dpms.n), p->s);
    free(v);
}
