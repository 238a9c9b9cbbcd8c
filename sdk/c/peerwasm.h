/*
 * peerwasm.h — the job contract for C (and C++) guests, header-only.
 *
 * A peerwasm job is a wasm32-wasi command: it reads its whole input from
 * stdin, writes its answer to stdout, and says how it went with its exit
 * code. This header is that contract, as the Rust SDK (peerwasm-sdk) has
 * it, and nothing more:
 *
 *   exit 0  the answer is on stdout (one line, JSON by convention);
 *   exit 1  the job failed (PEERWASM_EXIT_JOB_ERROR), "error: ..." on stderr;
 *   exit 2  its input is not valid for it (PEERWASM_EXIT_BAD_INPUT).
 *
 * Build with Debian's clang, lld, wasi-libc and libclang-rt-dev-wasm32:
 *
 *   clang --target=wasm32-wasi -O2 -I sdk/c -o primes-c.wasm guest-examples/c/primes.c
 *
 * Memory: a job whose allocation fails has hit its memory limit. Call
 * peerwasm_out_of_memory() (which traps, as Rust's allocation failure does)
 * rather than going on: the worker then reports `memory limit exceeded`
 * with the exact peak, and `map` retries it with more memory.
 */
#ifndef PEERWASM_H
#define PEERWASM_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEERWASM_EXIT_JOB_ERROR 1
#define PEERWASM_EXIT_BAD_INPUT 2

/* Prints "error: <message>" on stderr and exits with `code`. */
static inline void peerwasm_fail(int code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(code);
}

/* An allocation failed: the job is over its memory limit. Traps. */
static inline void peerwasm_out_of_memory(void) {
    __builtin_trap();
}

/* malloc that never returns NULL (see peerwasm_out_of_memory). */
static inline void *peerwasm_alloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) peerwasm_out_of_memory();
    return p;
}

/* Reads all of stdin; NUL-terminated (`*len` does not count the NUL). */
static inline char *peerwasm_read_input(size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = peerwasm_alloc(cap);
    for (;;) {
        if (n + 1 >= cap) {
            cap *= 2;
            char *bigger = realloc(buf, cap);
            if (!bigger) peerwasm_out_of_memory();
            buf = bigger;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) peerwasm_fail(PEERWASM_EXIT_BAD_INPUT, "cannot read stdin");
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* Writes the answer and a newline to stdout, then exits 0. */
static inline void peerwasm_answer(const char *text) {
    if (fputs(text, stdout) < 0 || fputc('\n', stdout) < 0 || fflush(stdout) != 0) {
        peerwasm_fail(PEERWASM_EXIT_JOB_ERROR, "cannot write stdout");
    }
    exit(0);
}

/*
 * Reads the unsigned integer member `key` of the JSON object `json`, e.g.
 * {"n": 100}. Returns 0 and sets *out, or -1 with a reason in `why` (the
 * input is then not valid for the job). A small reader for flat objects of
 * numbers, enough for examples; a job with richer input links a JSON
 * library (cJSON and jansson build for wasm32-wasi).
 */
static inline int peerwasm_json_u64(const char *json, const char *key, uint64_t *out, const char **why) {
    const char *p = json;
    size_t klen = strlen(key);
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p != '{') { *why = "expected a JSON object"; return -1; }
    for (;;) {
        p = strchr(p, '"');
        if (!p) { *why = "the member is missing"; return -1; }
        p++;
        const char *end = strchr(p, '"');
        if (!end) { *why = "an unterminated string"; return -1; }
        int match = (size_t)(end - p) == klen && strncmp(p, key, klen) == 0;
        p = end + 1;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (*p != ':') { *why = "expected ':' after a member name"; return -1; }
        p++;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!match) continue;
        if (*p < '0' || *p > '9') { *why = "the member is not an unsigned integer"; return -1; }
        uint64_t v = 0;
        while (*p >= '0' && *p <= '9') {
            uint64_t digit = (uint64_t)(*p - '0');
            if (v > (UINT64_MAX - digit) / 10) { *why = "the number is too large"; return -1; }
            v = v * 10 + digit;
            p++;
        }
        if (*p == '.' || *p == 'e' || *p == 'E') { *why = "the member is not an unsigned integer"; return -1; }
        *out = v;
        return 0;
    }
}

#endif /* PEERWASM_H */
