// Self-checking test programs: CHECK(cond, printf-args...) counts and reports a failure;
// finish() prints the verdict the tests look for and gives the exit status.
#pragma once
#include <cstdio>

static int failures = 0;
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            printf("FAIL line %d: ", __LINE__);                                            \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

static int finish() {
    printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
