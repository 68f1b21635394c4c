/* main.c - the kiln command line. */
#include <stdio.h>

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("kiln: not yet\n");
    return 0;
}
