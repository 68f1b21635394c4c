/* initmap.c - `kiln train --init-map FILE.lua` (cli.h): the names and shapes
 * of the --init-from file's tensors, handed to the frontend's map runner. */
#include "cli.h"
#include "train.h"

#include <stdio.h>
#include <stdlib.h>

InitMap *cli_init_map(const char *weights, const char *map_path)
{
    StFile f;
    Diag d = {{0}};
    if (!rt_st_read(weights, &f, &d)) {
        fprintf(stderr, "--init-from: %s\n", d.msg);
        return NULL;
    }
    const char **names = xcalloc((size_t)f.n + 1, sizeof *names);
    Shape *shapes = xcalloc((size_t)f.n + 1, sizeof *shapes);
    for (int i = 0; i < f.n; i++) {
        names[i] = f.t[i].name;
        shapes[i] = shape_make(f.t[i].dtype, f.t[i].rank, f.t[i].dim);
    }
    char err[2048];
    InitMap *m = fe_init_map(map_path, names, shapes, f.n, err, sizeof err);
    if (!m)
        fprintf(stderr, "%s\n", err);
    free(names);
    free(shapes);
    rt_st_free(&f);
    return m;
}
