/* autodiff.c - placeholder until the pass lands: leaves the graph unchanged. */
#include "passes.h"

bool pass_autodiff(Graph *g, const PassOpts *o, Diag *d)
{
    (void)g;
    (void)o;
    (void)d;
    return true;
}
