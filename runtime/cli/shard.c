/* shard.c - shard=auto for the commands (cli.h): the params' TP splits chosen
 * by passes/shard_auto.c, costed on a device of the cost model, set on the
 * model's graphs before anything compiles them. */
#include "cli.h"
#include "cpu.h" /* rt_cpu_device, rt_backend_cpu */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool cli_shard_auto(Model *m, const PassOpts *po, const CgDevice *dev, double alpha_s,
                    char **text, Diag *d)
{
    *text = NULL;
    if (!m->train.shard || strcmp(m->train.shard, "auto") != 0 || po->tp <= 1)
        return true;
    if (!dev || !dev->gpu)
        dev = dev ? dev : cg_device_find("h100");
    CgPredictOpts pk = cli_predict_opts(m, dev);
    PassShardCost c = {
        .device = dev->name,
        .flops = !dev->gpu ? (dev->gemm > 0 ? dev->gemm : dev->f32)
                 : pk.bf16 ? dev->bf16
                 : pk.tf32 ? dev->tf32
                           : dev->f32,
        .mem_bw = cg_device_bw(dev),
        .link_bw = dev->intra_bw > 0 ? dev->intra_bw : cg_device_bw(dev) / 2,
        .alpha_s = alpha_s,
        .mem = dev->mem,
    };
    if (!pass_shard_auto(m->g, po, &c, text, d))
        return false;
    if (m->eval_g)
        pass_shard_copy(m->g, m->eval_g);
    return true;
}

bool cli_shard_device(const Model *m, const char *device, int threads, int local,
                      const char *cache_dir, CgDevice *cpu, const CgDevice **dev, Diag *d)
{
    *dev = NULL;
    if (!m->train.shard || strcmp(m->train.shard, "auto") != 0 || m->train.tp <= 1)
        return true;
    bool on_cpu = !device || strcmp(device, "cpu") == 0;
    if (device && strcmp(device, "auto") == 0) {
        Diag q = {{0}};
        on_cpu = rt_backend_select("auto", false, &q) == &rt_backend_cpu;
    }
    if (!on_cpu) /* the GPU's name comes with its backend, after the choice */
        return true;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int th = threads > 0 ? threads : (int)((nc > 0 ? nc : 1) / (local > 0 ? local : 1));
    if (!rt_cpu_device(th > 0 ? th : 1, cache_dir, false, false, cpu, d))
        return false;
    *dev = cpu;
    return true;
}
