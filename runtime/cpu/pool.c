/* pool.c - the CPU backend's thread pool: runs fn(ctx, part) for the parts
 * of one job on the calling thread and the workers.
 *
 * The parts of a job go to whichever thread claims them first: a worker
 * that has not come yet (its core busy with another process) leaves them
 * to the caller instead of holding the step up. Idle workers spin for
 * SPIN_S, then sleep on a condition variable, so they hold a core for at
 * most that long while nothing runs. The spin spans the serial kernels
 * between two parallel steps: a worker that has gone to sleep costs a
 * wake-up (tens of microseconds on a virtual machine) per step, more than
 * the parallel part saves (gpt tiny, with backend_cpu.c's kernel_work
 * weighting: 1.0 ms/step with a 20 us spin, 0.55 with 300 us). */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

static const double SPIN_S = 300e-6, STEAL_S = 100e-6;

typedef struct {
    Pool *pool;
    int id; /* 1..nth */
} Worker;

/* Claims and runs parts of the current job until none is left, or after
 * the first when once; true when this thread finished the job's last part. */
static bool pool_work(Pool *pl, bool once)
{
    bool last = false;
    unsigned long long w = atomic_load(&pl->claim);
    for (;;) {
        int np = (int)(w >> 16 & 0xffff), part = (int)(w & 0xffff);
        if (part >= np)
            return last;
        PoolFn fn = atomic_load(&pl->fn);
        void *ctx = atomic_load(&pl->ctx);
        if (!atomic_compare_exchange_weak(&pl->claim, &w, w + 1))
            continue; /* w now holds the current word */
        fn(ctx, part);
        last = atomic_fetch_add(&pl->finished, 1) + 1 == np;
        if (once)
            return last;
        w = atomic_load(&pl->claim);
    }
}

/* True once every part of the current job is claimed. */
static bool pool_claimed(Pool *pl)
{
    unsigned long long w = atomic_load(&pl->claim);
    return (w & 0xffff) >= (w >> 16 & 0xffff);
}

static void *worker_main(void *arg)
{
    Worker *w = arg;
    Pool *pl = w->pool;
    unsigned long long seen = 0;
    for (;;) {
        unsigned long long g = atomic_load(&pl->gen);
        double t0 = ir_now();
        for (int64_t i = 1; g == seen; i++) {
            if (i % 256 == 0 && ir_now() - t0 > SPIN_S)
                break;
            g = atomic_load(&pl->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&pl->mu);
            while ((g = atomic_load(&pl->gen)) == seen && !pl->quit)
                pthread_cond_wait(&pl->go, &pl->mu);
            pthread_mutex_unlock(&pl->mu);
        }
        if (pl->quit)
            break;
        seen = g;
        if (pool_work(pl, false)) {
            pthread_mutex_lock(&pl->mu);
            pthread_cond_signal(&pl->done);
            pthread_mutex_unlock(&pl->mu);
        }
    }
    free(w);
    return NULL;
}

void pool_start(Pool *pl, int nth)
{
    memset(pl, 0, sizeof *pl);
    pthread_mutex_init(&pl->mu, NULL);
    pthread_cond_init(&pl->go, NULL);
    pthread_cond_init(&pl->done, NULL);
    pl->th = xcalloc((size_t)nth + 1, sizeof(pthread_t));
    for (int i = 0; i < nth; i++) {
        Worker *w = xmalloc(sizeof *w);
        w->pool = pl;
        w->id = i + 1;
        if (pthread_create(&pl->th[i], NULL, worker_main, w) != 0) {
            free(w);
            break;
        }
        pl->nth++;
    }
}

void pool_stop(Pool *pl)
{
    if (!pl->th)
        return;
    pthread_mutex_lock(&pl->mu);
    pl->quit = true;
    atomic_fetch_add(&pl->gen, 1);
    pthread_cond_broadcast(&pl->go);
    pthread_mutex_unlock(&pl->mu);
    for (int i = 0; i < pl->nth; i++)
        pthread_join(pl->th[i], NULL);
    free(pl->th);
    pl->th = NULL;
    pthread_mutex_destroy(&pl->mu);
    pthread_cond_destroy(&pl->go);
    pthread_cond_destroy(&pl->done);
}

/* Runs fn(ctx, 0..nparts-1) on the caller and whichever workers come. */
void pool_run(Pool *pl, int nparts, PoolFn fn, void *ctx)
{
    if (nparts <= 1 || pl->nth == 0) {
        for (int i = 0; i < nparts; i++)
            fn(ctx, i);
        return;
    }
    if (nparts > 0xffff)
        die("cpu backend: %d parts in one job", nparts);
    atomic_store(&pl->fn, fn);
    atomic_store(&pl->ctx, ctx);
    atomic_store(&pl->finished, 0);
    unsigned long long job = (atomic_load(&pl->claim) >> 32) + 1;
    atomic_store(&pl->claim, job << 32 | (unsigned long long)nparts << 16);
    pthread_mutex_lock(&pl->mu);
    atomic_fetch_add(&pl->gen, 1);
    pthread_cond_broadcast(&pl->go);
    pthread_mutex_unlock(&pl->mu);
    /* one part, then the workers get STEAL_S to claim theirs (an awake
     * worker does within a microsecond; one woken from sleep within tens)
     * before the caller takes what is left */
    pool_work(pl, true);
    double t0 = ir_now();
    for (int64_t i = 1; !pool_claimed(pl); i++)
        if (i % 64 == 0 && ir_now() - t0 > STEAL_S)
            break;
    pool_work(pl, false);
    t0 = ir_now();
    for (int64_t i = 1; atomic_load(&pl->finished) < nparts; i++)
        if (i % 256 == 0 && ir_now() - t0 > SPIN_S)
            break;
    if (atomic_load(&pl->finished) < nparts) {
        pthread_mutex_lock(&pl->mu);
        while (atomic_load(&pl->finished) < nparts)
            pthread_cond_wait(&pl->done, &pl->mu);
        pthread_mutex_unlock(&pl->mu);
    }
}

