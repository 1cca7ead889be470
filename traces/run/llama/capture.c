/* mtpscope: a native ggml `cb_eval` callback that copies one named graph node per decode.
 *
 * Built on first use by mtpscope.traces.run.llama.native_capture (cc -O2 -shared -fPIC) into the cache folder and
 * loaded with ctypes. It links against nothing: ggml_backend_tensor_get / ggml_nbytes and the offsets of
 * the fields of `struct ggml_tensor` it reads come from Python in `mtps_capture` (the same ctypes mirror
 * the Python callback uses, checked against ggml_tensor_overhead()).
 *
 * The scheduler asks about every node of the graph (about 140 per drafter step); the Python callback pays a
 * ctypes transition and a few bytecodes for each. Here an ask is one strncmp.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*mtps_get_fn)(const void *tensor, void *data, size_t offset, size_t size);
typedef size_t (*mtps_nbytes_fn)(const void *tensor);

#define MTPS_MAX_NAME 64 /* GGML_MAX_NAME */

typedef struct {
    mtps_get_fn get;       /* ggml_backend_tensor_get */
    mtps_nbytes_fn nbytes; /* ggml_nbytes */
    int64_t name_offset;   /* offsetof(struct ggml_tensor, name) */
    int64_t type_offset;   /* offsetof(struct ggml_tensor, type) (an int) */
    int64_t ne_offset;     /* offsetof(struct ggml_tensor, ne) (int64_t[4]) */
    int64_t enabled;       /* 0: answer "not needed" for every node */
    char name[MTPS_MAX_NAME];
    void *buf;             /* the first occurrence's bytes (malloc'ed here, grown as needed) */
    int64_t cap;           /* bytes allocated at buf */
    int64_t n_seen;        /* occurrences of `name` computed since the last reset */
    int64_t n_asks;        /* nodes asked about since the last reset */
    int64_t nbytes_got;    /* bytes copied to buf (0: none; -1: out of memory) */
    int64_t type;          /* ggml type of the copied node */
    int64_t ne[4];         /* its ne (ggml order) */
} mtps_capture;

bool mtps_capture_cb(void *t, bool ask, void *user_data) {
    mtps_capture *c = (mtps_capture *)user_data;
    const char *name = (const char *)t + c->name_offset;
    if (ask) {
        c->n_asks++;
        return c->enabled && strncmp(name, c->name, MTPS_MAX_NAME) == 0;
    }
    if (c->n_seen++ == 0) {
        size_t nb = c->nbytes(t);
        if ((int64_t)nb > c->cap) {
            void *p = realloc(c->buf, nb);
            if (p == NULL) {
                c->nbytes_got = -1;
                return true;
            }
            c->buf = p;
            c->cap = (int64_t)nb;
        }
        c->get(t, c->buf, 0, nb);
        c->nbytes_got = (int64_t)nb;
        c->type = *(const int *)((const char *)t + c->type_offset);
        memcpy(c->ne, (const char *)t + c->ne_offset, sizeof c->ne);
    }
    return true;
}

void mtps_capture_reset(mtps_capture *c) {
    c->n_seen = 0;
    c->n_asks = 0;
    c->nbytes_got = 0;
}

void mtps_capture_free(mtps_capture *c) {
    free(c->buf);
    c->buf = NULL;
    c->cap = 0;
}
