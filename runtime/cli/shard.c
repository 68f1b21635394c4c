/* shard.c - shard=auto for the commands (cli.h): the params' TP splits chosen
 * by passes/shard_auto.c, costed on a device of the cost model, set on the
 * model's graphs before anything compiles them. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
