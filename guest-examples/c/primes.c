/*
 * The `primes` job in C: {"n": N} -> {"count": <primes below N>}, the same
 * input, answer, errors and exit codes as the Rust guest (src/bin/primes.rs).
 *
 *   clang --target=wasm32-wasi -O2 -I sdk/c -o primes-c.wasm guest-examples/c/primes.c
 */
#include <inttypes.h>

#include "peerwasm.h"

/* Number of primes p < n: a sieve over the odd numbers, as the Rust kernel. */
static uint64_t count_primes_below(uint64_t n) {
    if (n <= 2) return 0;
    uint64_t half = n / 2;
    /* composite[i] is about the odd number 2i + 1. */
    unsigned char *composite = peerwasm_alloc((size_t)half);
    uint64_t count = 1; /* the prime 2 */
    for (uint64_t i = 1; i < half; i++) {
        if (composite[i]) continue;
        count++;
        uint64_t p = 2 * i + 1;
        for (uint64_t j = p * p / 2; j < half; j += p) composite[j] = 1;
    }
    free(composite);
    return count;
}

int main(void) {
    char *input = peerwasm_read_input(NULL);
    uint64_t n;
    const char *why;
    if (peerwasm_json_u64(input, "n", &n, &why) != 0) {
        peerwasm_fail(PEERWASM_EXIT_BAD_INPUT, "input is not valid for this job: %s", why);
    }
    if (n > (1ULL << 32)) {
        peerwasm_fail(PEERWASM_EXIT_JOB_ERROR, "n = %" PRIu64 " is too large (at most 2^32)", n);
    }
    char answer[64];
    snprintf(answer, sizeof answer, "{\"count\":%" PRIu64 "}", count_primes_below(n));
    peerwasm_answer(answer);
}
