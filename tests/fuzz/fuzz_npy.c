/* fuzz_npy.c - the .npy reader (rt_npy_read) through the path every file of
 * a tensors data directory takes: the bytes go to a memfd, read by its
 * /proc/self/fd path. Any input gives an array or a message naming the
 * path with the tensor left empty, never a crash. On what the reader
 * accepts: a kiln dtype, rank <= IR_MAX_RANK, nbytes = numel x dtype size,
 * and every byte of the data is read.
 *
 * Seed corpus (tests/fuzz/corpus/npy/): valid files of versions 1.0, 2.0
 * and 3.0 (f4, i4, i8, u1, f2; a 0-d array, an empty one) as numpy writes
 * them, and the refusals: Fortran order, big-endian, an object array, a
 * structured dtype, float64, a truncated file, a header that claims more
 * data than there is, a huge shape, a bad version. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime.h"
#include "train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Built once, kept for the process (reachable: no leak report). */
static int fd = -1;
static char path[64];
static volatile uint8_t sink; /* the array's bytes, read */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fd < 0) {
        fd = memfd_create("fuzz.npy", MFD_CLOEXEC);
        if (fd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size))
        abort();
    StTensor t;
    Diag d;
    d.msg[0] = 0;
    if (!rt_npy_read(path, &t, &d)) {
        if (!strstr(d.msg, path) || t.data || t.nbytes || t.rank)
            abort(); /* every refusal names the file and leaves t empty */
        return 0;
    }
    if (t.rank < 0 || t.rank > IR_MAX_RANK || (int)t.dtype < 0 || t.dtype >= DT__COUNT)
        abort();
    uint64_t n = (uint64_t)dtype_size(t.dtype);
    for (int i = 0; i < t.rank; i++)
        n *= (uint64_t)t.dim[i];
    if (n != t.nbytes || !t.data)
        abort();
    uint8_t sum = 0;
    for (size_t k = 0; k < t.nbytes; k++)
        sum ^= ((const uint8_t *)t.data)[k];
    sink = sum;
    free(t.data);
    return 0;
}
