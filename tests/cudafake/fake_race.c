/* fake_race.c - the fake driver's race detector (the contract: "Races" at
 * the top of fake_cuda.c): every op that ran is checked against the ops
 * before it that its vector clock does not order it after, by the byte
 * ranges each reads and writes; a kernel's reads reach from each pointer
 * argument to the next buffer start the fake has been given. */
#include "fake_ops.h"

#include <stdlib.h>
#include <string.h>

/* a ordered before b (a ran before b was checked) */
static bool before(const FOp *a, const FOp *b) { return a->seq <= b->vc[a->stream]; }

/* Every device address a launch, copy, memset, GEMM or all-reduce was given
 * as the start of what it touches: the starts of the buffers, sorted. */
static uint64_t *starts;
static int nstarts, capstarts;

void fake_race_note_start(uint64_t p)
{
    int lo = 0, hi = nstarts;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (starts[mid] < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < nstarts && starts[lo] == p)
        return;
    if (nstarts == capstarts) {
        capstarts = capstarts ? 2 * capstarts : 256;
        starts = realloc(starts, sizeof(uint64_t) * (size_t)capstarts);
        if (!starts)
            fakecu_die("out of memory");
    }
    memmove(starts + lo + 1, starts + lo, sizeof(uint64_t) * (size_t)(nstarts - lo));
    starts[lo] = p;
    nstarts++;
}

/* The end of a kernel's read through pointer argument p: the next buffer
 * start after p (fake_race_note_start), or the end of p's allocation. */
static uint64_t read_end(uint64_t p)
{
    Alloc *a = fake_find_alloc(p);
    uint64_t end = a ? a->hi : p + 1;
    int lo = 0, hi = nstarts;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (starts[mid] <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < nstarts && starts[lo] < end)
        end = starts[lo];
    return end;
}

/* A range of o: a kernel's read through a pointer argument is stored as
 * {p, 0} and reaches to read_end(p). */
static uint64_t acc_hi(const FakeRange *r) { return r->hi ? r->hi : read_end(r->lo); }

static const FakeRange *conflict(const FOp *w, const FOp *o)
{
    for (int i = 0; i < w->nacc; i++) {
        if (!w->acc[i].write)
            continue;
        for (int j = 0; j < o->nacc; j++)
            if (w->acc[i].lo < acc_hi(&o->acc[j]) && o->acc[j].lo < w->acc[i].hi)
                return &w->acc[i];
    }
    return NULL;
}

void fake_race_check(const FOp *hist, const FOp *o)
{
    for (const FOp *a = hist; a; a = a->next) {
        if (a->stream == o->stream || before(a, o))
            continue;
        const FakeRange *r = conflict(a, o);
        const FOp *w = a, *other = o;
        if (!r) {
            r = conflict(o, a);
            w = o;
            other = a;
        }
        if (r)
            fakecu_die("race: %s (stream %d, op %llu) and %s (stream %d, op %llu) are not "
                       "ordered (no stream order, event or synchronisation between them), and "
                       "the first writes [0x%llx, 0x%llx), which the second also touches",
                       w->desc, w->stream, (unsigned long long)w->id, other->desc,
                       other->stream, (unsigned long long)other->id,
                       (unsigned long long)r->lo, (unsigned long long)r->hi);
    }
}
