/* pp_internal.h - what the pipeline's files of runtime/dist share (pp.c:
 * the stages' programs, the schedule and the step; pp_whole.c: whole
 * tensors for weights files, checkpoints and --init-from; pp_report.c:
 * the cut and schedule print, the trace and the summary): the pipeline's
 * state. Internal to those files; dist.h is the layer's contract. */
#ifndef KILN_PP_INTERNAL_H
#define KILN_PP_INTERNAL_H

#include "codegen.h"
#include "dist.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *name;
    int64_t numel;
    int prog, out; /* its gradient: which program (P_F, P_B, P_W) and output */
    int step;      /* its "pp.grad.P" input in the step graph (-1: frozen) */
    int64_t zstart; /* zero=1: its start in the step's flat order (-1: not in it) */
    bool norm;     /* counted in the norm here (its first owning stage) */
    int *owners;   /* stages reading it (tied: more than one) */
    int nown;
    float *acc;
} PpParam;

enum { P_F, P_B, P_W, P__N };
enum { H_B, H_W };

typedef struct {
    char kind; /* 'F', 'B', 'W'; 'r': a receive */
    int mb;
    double start, end;
} PpEvent;

/* A tensor a program reads or writes: its id there, and where it lives in
 * the micro-batch's record (what: 0 stash until B, 1 received activation,
 * 2 received gradient, 3 stash until W) */
typedef struct {
    int t, what;
    int64_t off, bytes;
    const char *name; /* outputs: the stash's name */
    /* transfers on the device: dev, received into this program's tensor
     * (not written from the host before its run); back, read back into
     * the host record after its run (a later program reads it too) */
    bool dev, back;
} PpSlot;

/* Transfers on the device: where received tensor K goes (the executor of
 * program prog, its tensor t; prog -1: none reads it, the backend's
 * scratch); now: read back into the host record at once (the receiving
 * action's own program does not read it). */
typedef struct {
    int prog, t;
    bool now;
} PpDst;

typedef struct {
    Graph *g;
    Exec *e;           /* NULL: no ops */
    VEC(PpSlot) in;    /* written before each run */
    VEC(PpSlot) out;   /* read after (stash outputs) */
} PpProg;

struct RtPp {
    RtComm *comm;
    int n, s, m, sched;
    double *tstage; /* --pp-balance time: each stage's measured seconds per
                       micro-batch (pp_balance.c); NULL: the cost model's cut */
    Graph *fwd;     /* the forward graph the cut is of (after attention) */
    PassStageCut cut;
    PpProg pr[P__N];
    int nrecv, nsend;
    int *send_f;    /* per K: "pp.send.K" in F */
    int *grad_b;    /* per K: "grad.pp.recv.K" in B */
    int64_t *recv_off, *send_off; /* byte offsets of K in a message; [n] = its size */
    int64_t rec;    /* bytes of a micro-batch's stash record */
    VEC(PpParam) ps;
    int loss_f;
    PassStageAct *acts;
    int *wcap;      /* zb-h1: per stage, the most W's kept waiting (zbh1_caps) */
    /* a micro-batch holds two slots: hold[H_B] from its F to its B (what
     * only F and B read), hold[H_W] from its F to its W (what W reads);
     * nslot[h]: the schedule's peak of micro-batches holding one; slot_of[h]
     * [k]: micro-batch k's this step; the received activation and gradient
     * are held until W where W reads them (xin, gin: which hold) */
    int nslot[2];
    int *slot_of[2];
    char *taken[2];  /* per slot: held now */
    int xin, gin;
    int64_t recw;   /* bytes of a record held until W ("rec": until B) */
    char *stash;    /* nslot[H_B] records of rec bytes */
    char *wstash;   /* nslot[H_W] records of recw bytes */
    char *xrecv;    /* nslot[xin] received activations */
    char *grecv;    /* nslot[gin] received gradients */
    char *ysend;    /* m sent activations */
    char *gsend;    /* m sent gradients */
    float *tmp;
    bool dev;       /* activations and gradients by the device (rt_exec_pp_setup) */
    PpDst *adst, *gdst; /* dev: per K, the received activation's and gradient's */
    int64_t rows;   /* the model's batch b */
    int64_t shard;  /* zero=1: elements of the stage's AdamW state shard; 0: none */
    /* zero=1: the step graph's input "pp.grad.shard" (-1: none), the flat
     * order's length, this rank's range of it, the flat gradients and the
     * shard of their mean over the dp group (ztotal and zS elements) */
    int gshard;
    int64_t ztotal, zS, zoff, zlen;
    float *zflat, *zsh;
    RematReport remat; /* remat_on: what remat chose for the stage */
    bool remat_on;
    int64_t rec_plain; /* remat_on: the stash record's bytes without remat */
    double *losses; /* m */
    double flops;
    /* this step's actions and receives (ir_now seconds), for the trace;
     * per step: seconds running programs and waiting in receives */
    VEC(PpEvent) ev;
    VEC(double) busy, wait, dpms; /* dpms: the dp all-reduces' ms per step */
    VEC(double) idle; /* per step: this stage's idle share of the pipeline's span */
    /* evaluation when the training forward draws random numbers (dropout):
     * the evaluation graph's stage (rt_pp_build_eval), NULL: F evaluates */
    Graph *efwd;
    PassStageCut ecut;
    Graph *eg;
    Exec *ee;
    int *eslot;                   /* per K of ecut.cross[s]: "pp.recv.K" in eg */
    int *esend;                   /* per K of ecut.cross[s + 1]: "pp.send.K" */
    int64_t *eroff, *esoff;       /* byte offsets in a message; [n] = its size */
    char *ebuf;
    Graph *ug;      /* rt_pp_ckpt_whole's graph: every stage's params and state */
    Graph *wg;      /* whole_graph's */
    int *uholder;   /* per tensor of ug: the first stage holding it */
};

#endif
