/*
 * infer_identity.c - a minimal inferpool client in C, using nothing but libzmq.
 *
 * It proves that the inferpool wire protocol (docs/PROTOCOL.md) serves ZeroMQ clients in any
 * language: it sends one `infer` request for the identity model (INPUT0, FP32, shape [4],
 * values 1.5 2.5 3.5 4.5) over a REQ socket and checks that OUTPUT0 comes back unchanged.
 *
 * Usage:
 *   infer_identity ENDPOINT [MODEL]            infer on MODEL (default "identity")
 *   infer_identity ENDPOINT [MODEL] --health   send health_ready, print its `ready` value
 *                                              (health_ready is server-wide: MODEL is unused)
 *   infer_identity ENDPOINT [MODEL] --lane     the same inference through a lane: the input
 *                                              written in a server-made region, the request
 *                                              and its response through the lane's rings
 *                                              (docs/PROTOCOL.md, "Lanes"), the output read
 *                                              in place in the worker's region
 *
 * Environment:
 *   INFERPOOL_TIMEOUT_MS   send/receive timeout in milliseconds (default 10000; -1 = forever)
 *
 * Exit status:
 *   0  infer: OUTPUT0 equals INPUT0 ("OK" printed)     --health: ready is true
 *   1  infer: a mismatch, or a response that breaks the protocol
 *                                                       --health: ready is false (or unreadable)
 *   2  the server answered with an error; its code and message go to stderr
 *   3  timed out waiting for the server
 *   4  usage error or a failing local libzmq call
 */

#define _GNU_SOURCE /* syscall(), for the futex */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

enum {
    EXIT_MATCH = 0,
    EXIT_MISMATCH = 1,
    EXIT_SERVER_ERROR = 2,
    EXIT_TIMEOUT = 3,
    EXIT_LOCAL = 4,
};

#define DEFAULT_TIMEOUT_MS 10000
#define REQUEST_ID "c-1"     /* the response must echo it */
#define N_VALUES 4
#define MAX_FRAMES 16        /* more frames than this in one response is a protocol error */

static const char *prog = "infer_identity";

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void errorf(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* Report a failed libzmq call (errno set by libzmq). */
static void zmq_failed(const char *call)
{
    errorf("%s failed: %s", call, zmq_strerror(zmq_errno()));
}

/* ======================================================================================
 * A tiny JSON scanner: just enough to read a response header.
 *
 * It never builds a tree. A `Json` cursor points into the header bytes (not NUL-terminated);
 * the helpers below find a key in an object, step through an array, and read a string, an
 * integer or a boolean. Whitespace and key order do not matter, and a key is only matched as a
 * member of the object being searched (never inside a nested value or a string).
 *
 * The whole header is validated once (json_skip_value over all of it) before any lookup, so the
 * lookups run over well-formed JSON.
 *
 * Limits, all harmless for inferpool headers:
 *   - keys longer than KEY_MAX bytes are skipped, never matched;
 *   - with duplicate keys, the first one wins;
 *   - integers must fit in a long long and be written without fraction or exponent
 *     (so a shape of [4.0] does not read as 4);
 *   - nesting deeper than DEPTH_MAX is rejected as malformed;
 *   - \uXXXX escapes are decoded to UTF-8 (surrogate pairs included; a lone surrogate becomes
 *     U+FFFD); invalid UTF-8 in the input is passed through unchecked;
 *   - numbers are checked against the JSON grammar but never converted to floating point.
 * ==================================================================================== */

#define KEY_MAX 64
#define DEPTH_MAX 64

typedef struct {
    const char *p;   /* next byte to read */
    const char *end; /* one past the last byte */
} Json;

static int json_peek(Json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

/* Consume `lit` (e.g. "true") at the cursor; 0 on success, -1 if it is not there. */
static int json_literal(Json *j, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0)
        return -1;
    j->p += n;
    return 0;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Append byte c to out[cap] at *n, always leaving room for the NUL; note truncation. */
static void put_byte(char *out, size_t cap, size_t *n, int *fits, unsigned c)
{
    if (out == NULL)
        return;
    if (*n + 1 < cap)
        out[(*n)++] = (char)c;
    else
        *fits = 0;
}

static void put_utf8(char *out, size_t cap, size_t *n, int *fits, unsigned cp)
{
    if (cp < 0x80) {
        put_byte(out, cap, n, fits, cp);
    } else if (cp < 0x800) {
        put_byte(out, cap, n, fits, 0xC0 | (cp >> 6));
        put_byte(out, cap, n, fits, 0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        put_byte(out, cap, n, fits, 0xE0 | (cp >> 12));
        put_byte(out, cap, n, fits, 0x80 | ((cp >> 6) & 0x3F));
        put_byte(out, cap, n, fits, 0x80 | (cp & 0x3F));
    } else {
        put_byte(out, cap, n, fits, 0xF0 | (cp >> 18));
        put_byte(out, cap, n, fits, 0x80 | ((cp >> 12) & 0x3F));
        put_byte(out, cap, n, fits, 0x80 | ((cp >> 6) & 0x3F));
        put_byte(out, cap, n, fits, 0x80 | (cp & 0x3F));
    }
}

/*
 * Read the string at the cursor, decoding escapes into out[cap] (NUL-terminated, truncated if
 * needed; out may be NULL to just skip it). *fits (if not NULL) is set to 0 on truncation.
 * Returns 0, or -1 if the cursor is not at a well-formed string.
 */
static int json_string(Json *j, char *out, size_t cap, int *fits)
{
    size_t n = 0;
    int ok = 1;
    if (json_peek(j) != '"')
        return -1;
    j->p++;
    for (;;) {
        if (j->p >= j->end)
            return -1;
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"')
            break;
        if (c < 0x20)
            return -1; /* raw control characters are not allowed in JSON strings */
        if (c != '\\') {
            put_byte(out, cap, &n, &ok, c);
            continue;
        }
        if (j->p >= j->end)
            return -1;
        c = (unsigned char)*j->p++;
        switch (c) {
        case '"': case '\\': case '/': put_byte(out, cap, &n, &ok, c); break;
        case 'b': put_byte(out, cap, &n, &ok, '\b'); break;
        case 'f': put_byte(out, cap, &n, &ok, '\f'); break;
        case 'n': put_byte(out, cap, &n, &ok, '\n'); break;
        case 'r': put_byte(out, cap, &n, &ok, '\r'); break;
        case 't': put_byte(out, cap, &n, &ok, '\t'); break;
        case 'u': {
            unsigned cp, lo;
            if (j->end - j->p < 4 || hex4(j->p, &cp) != 0)
                return -1;
            j->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' &&
                j->p[1] == 'u' && hex4(j->p + 2, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                j->p += 6;
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                cp = 0xFFFD; /* lone surrogate */
            }
            put_utf8(out, cap, &n, &ok, cp);
            break;
        }
        default:
            return -1;
        }
    }
    if (out != NULL && cap > 0)
        out[n] = '\0';
    if (fits != NULL)
        *fits = ok;
    return 0;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }

/* Skip a number per the JSON grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int json_skip_number(Json *j)
{
    const char *p = j->p, *e = j->end;
    if (p < e && *p == '-')
        p++;
    if (p < e && *p == '0')
        p++;
    else if (p < e && is_digit(*p))
        while (p < e && is_digit(*p))
            p++;
    else
        return -1;
    if (p < e && *p == '.') {
        p++;
        if (!(p < e && is_digit(*p)))
            return -1;
        while (p < e && is_digit(*p))
            p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-'))
            p++;
        if (!(p < e && is_digit(*p)))
            return -1;
        while (p < e && is_digit(*p))
            p++;
    }
    j->p = p;
    return 0;
}

static int json_skip(Json *j, int depth);

/*
 * Containers. An array is walked with json_array_open then json_array_next until it returns 0;
 * objects likewise with json_object_next, which also reads the member's key.
 */
static int json_array_open(Json *j)
{
    if (json_peek(j) != '[')
        return -1;
    j->p++;
    return 0;
}

/* Position *elem at the next element and move past it: 1, 0 at the end of the array, -1. */
static int json_array_next(Json *j, Json *elem, int depth)
{
    int c = json_peek(j);
    if (c == ']') {
        j->p++;
        return 0;
    }
    if (elem != NULL)
        *elem = *j;
    if (json_skip(j, depth + 1) != 0)
        return -1;
    c = json_peek(j);
    if (c == ',') {
        j->p++;
        if (json_peek(j) == ']')
            return -1; /* trailing comma */
    } else if (c != ']') {
        return -1;
    }
    return 1;
}

static int json_object_open(Json *j)
{
    if (json_peek(j) != '{')
        return -1;
    j->p++;
    return 0;
}

/*
 * Read the next member: its key into key[KEY_MAX] (*key_fits = 0 if it was longer), *val at its
 * value, and move past it. Returns 1, 0 at the end of the object, -1 if malformed.
 */
static int json_object_next(Json *j, char *key, int *key_fits, Json *val, int depth)
{
    int c = json_peek(j);
    if (c == '}') {
        j->p++;
        return 0;
    }
    if (json_string(j, key, KEY_MAX, key_fits) != 0 || json_peek(j) != ':')
        return -1;
    j->p++;
    json_peek(j);
    if (val != NULL)
        *val = *j;
    if (json_skip(j, depth + 1) != 0)
        return -1;
    c = json_peek(j);
    if (c == ',') {
        j->p++;
        if (json_peek(j) == '}')
            return -1; /* trailing comma */
    } else if (c != '}') {
        return -1;
    }
    return 1;
}

/* Skip any one value at the cursor: 0, or -1 if it is malformed or nested too deeply. */
static int json_skip(Json *j, int depth)
{
    char key[KEY_MAX];
    int fits, r;
    if (depth > DEPTH_MAX)
        return -1;
    switch (json_peek(j)) {
    case '"':
        return json_string(j, NULL, 0, NULL);
    case '{':
        j->p++;
        while ((r = json_object_next(j, key, &fits, NULL, depth)) == 1)
            ;
        return r;
    case '[':
        j->p++;
        while ((r = json_array_next(j, NULL, depth)) == 1)
            ;
        return r;
    case 't':
        return json_literal(j, "true");
    case 'f':
        return json_literal(j, "false");
    case 'n':
        return json_literal(j, "null");
    default:
        return json_skip_number(j);
    }
}

/* 0 if [p, end) holds exactly one well-formed JSON object (plus whitespace), else -1. */
static int json_validate_object(const char *p, size_t len)
{
    Json j = {p, p + len};
    if (json_peek(&j) != '{' || json_skip(&j, 0) != 0)
        return -1;
    return json_peek(&j) == -1 ? 0 : -1;
}

/* Find member `key` of the object at *obj; set *val to its value. 1 found, 0 absent, -1 bad. */
static int json_get(const Json *obj, const char *key, Json *val)
{
    Json j = *obj;
    char k[KEY_MAX];
    int fits, r;
    if (json_object_open(&j) != 0)
        return -1;
    while ((r = json_object_next(&j, k, &fits, val, 0)) == 1)
        if (fits && strcmp(k, key) == 0)
            return 1;
    return r;
}

/* The string value at *v into out[cap]: 1 if it is a string that fits, else 0. */
static int json_get_string(const Json *v, char *out, size_t cap)
{
    Json j = *v;
    int fits;
    if (json_peek(&j) != '"' || json_string(&j, out, cap, &fits) != 0)
        return 0;
    return fits;
}

/* The string member `key` of the object *obj, or 0 if absent / not a string / too long. */
static int json_member_string(const Json *obj, const char *key, char *out, size_t cap)
{
    Json v;
    return json_get(obj, key, &v) == 1 && json_get_string(&v, out, cap);
}

/* The integer value at *v (see the limits above): 1, or 0 if it is not an integer. */
static int json_get_int(const Json *v, long long *out)
{
    Json j = *v;
    const char *start;
    char buf[32];
    char *endp;
    json_peek(&j);
    start = j.p;
    if (json_skip_number(&j) != 0 || (size_t)(j.p - start) >= sizeof buf)
        return 0;
    memcpy(buf, start, (size_t)(j.p - start));
    buf[j.p - start] = '\0';
    if (strpbrk(buf, ".eE") != NULL)
        return 0;
    errno = 0;
    *out = strtoll(buf, &endp, 10);
    return errno == 0 && *endp == '\0';
}

/* The boolean value at *v: 1 with *out set, or 0 if it is not true/false. */
static int json_get_bool(const Json *v, int *out)
{
    Json j = *v;
    int c = json_peek(&j);
    if (c == 't' && json_literal(&j, "true") == 0) {
        *out = 1;
        return 1;
    }
    if (c == 'f' && json_literal(&j, "false") == 0) {
        *out = 0;
        return 1;
    }
    return 0;
}

/* ======================================================================================
 * Building the request header.
 * ==================================================================================== */

typedef struct {
    char data[2048];
    size_t len;
    int overflow;
} Buf;

static void buf_add(Buf *b, const char *s, size_t n)
{
    if (b->overflow || n >= sizeof b->data - b->len) {
        b->overflow = 1;
        return;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static void buf_str(Buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* Append s as a quoted JSON string (escaping quotes, backslashes and control characters). */
static void buf_json_string(Buf *b, const char *s)
{
    buf_add(b, "\"", 1);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            buf_add(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            int n = snprintf(esc, sizeof esc, "\\u%04x", c);
            buf_add(b, esc, (size_t)n);
        } else {
            buf_add(b, (const char *)&c, 1);
        }
    }
    buf_add(b, "\"", 1);
}

/* FP32 <-> little-endian bytes, independent of the host's byte order. */
static void fp32_to_le(float f, unsigned char out[4])
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    for (int i = 0; i < 4; i++)
        out[i] = (unsigned char)(u >> (8 * i));
}

static float fp32_from_le(const unsigned char in[4])
{
    uint32_t u = 0;
    float f;
    for (int i = 0; i < 4; i++)
        u |= (uint32_t)in[i] << (8 * i);
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ======================================================================================
 * Messaging. With a REQ socket libzmq adds and strips the empty delimiter frame itself, so we
 * send [header, tensor...] and receive [header, tensor...].
 * ==================================================================================== */

typedef struct {
    zmq_msg_t frames[MAX_FRAMES];
    int n; /* initialised frames, all of which reply_close releases */
} Reply;

static const char *endpoint;
static int timeout_ms = DEFAULT_TIMEOUT_MS;

static void report_timeout(const char *what)
{
    errorf("timed out after %d ms %s %s (is the broker running and listening there?)",
           timeout_ms, what, endpoint);
}

/* Send one frame (flags: 0 or ZMQ_SNDMORE): 0, or an exit status. */
static int send_frame(void *sock, const void *data, size_t len, int flags)
{
    int rc;
    do
        rc = zmq_send(sock, data, len, flags);
    while (rc == -1 && zmq_errno() == EINTR);
    if (rc == -1) {
        if (zmq_errno() == EAGAIN) {
            report_timeout("sending to");
            return EXIT_TIMEOUT;
        }
        zmq_failed("zmq_send");
        return EXIT_LOCAL;
    }
    return 0;
}

/* Receive one whole multipart response into *r: 0, or an exit status. */
static int recv_reply(void *sock, Reply *r)
{
    r->n = 0;
    for (;;) {
        zmq_msg_t *m;
        int rc;
        if (r->n == MAX_FRAMES) {
            errorf("the response has more than %d frames", MAX_FRAMES);
            return EXIT_MISMATCH;
        }
        m = &r->frames[r->n];
        if (zmq_msg_init(m) != 0) {
            zmq_failed("zmq_msg_init");
            return EXIT_LOCAL;
        }
        r->n++;
        do
            rc = zmq_msg_recv(m, sock, 0);
        while (rc == -1 && zmq_errno() == EINTR);
        if (rc == -1) {
            if (zmq_errno() == EAGAIN) {
                report_timeout("waiting for a response from");
                return EXIT_TIMEOUT;
            }
            zmq_failed("zmq_msg_recv");
            return EXIT_LOCAL;
        }
        if (!zmq_msg_more(m))
            return 0;
    }
}

static void reply_close(Reply *r)
{
    for (int i = 0; i < r->n; i++)
        if (zmq_msg_close(&r->frames[i]) != 0)
            zmq_failed("zmq_msg_close");
    r->n = 0;
}

/*
 * Check what every response must satisfy: the header (frame 0) is one JSON object, it carries
 * no "error" (else print the code and message), and `type` and `id` echo the request.
 * On success *top points at the header object and 0 is returned; otherwise an exit status.
 */
static int check_envelope(Reply *r, const char *type, Json *top)
{
    const char *hdr = zmq_msg_data(&r->frames[0]);
    size_t len = zmq_msg_size(&r->frames[0]);
    char buf[KEY_MAX];
    Json err;
    top->p = hdr;
    top->end = hdr + len;

    if (json_validate_object(hdr, len) != 0) {
        errorf("the response header is not one well-formed JSON object (nested at most %d deep): "
               "%.*s", DEPTH_MAX, len > 400 ? 400 : (int)len, hdr);
        return EXIT_MISMATCH;
    }
    /* "error": {"code": ..., "message": ...}; an explicit null counts as no error. */
    if (json_get(top, "error", &err) == 1 && json_peek(&err) != 'n') {
        char code[KEY_MAX] = "?", message[4096] = "";
        Json v;
        if (!json_member_string(&err, "code", code, sizeof code))
            strcpy(code, "(no readable code)");
        if (json_get(&err, "message", &v) == 1) {
            Json s = v;
            int fits;
            if (json_peek(&s) != '"' || json_string(&s, message, sizeof message, &fits) != 0)
                strcpy(message, "(message is not a string)");
        }
        errorf("server error %s: %s", code, message);
        return EXIT_SERVER_ERROR;
    }
    if (!json_member_string(top, "type", buf, sizeof buf) || strcmp(buf, type) != 0) {
        errorf("the response's \"type\" is not \"%s\"", type);
        return EXIT_MISMATCH;
    }
    if (!json_member_string(top, "id", buf, sizeof buf) || strcmp(buf, REQUEST_ID) != 0) {
        errorf("the response does not echo the request id \"%s\"", REQUEST_ID);
        return EXIT_MISMATCH;
    }
    return 0;
}

/* ======================================================================================
 * The two modes.
 * ==================================================================================== */

static int do_infer(void *sock, const char *model)
{
    static const float values[N_VALUES] = {1.5f, 2.5f, 3.5f, 4.5f};
    unsigned char input[N_VALUES * 4];
    Buf b = {.len = 0, .overflow = 0};
    Reply r = {.n = 0};
    Json top, outs, elem, out0 = {NULL, NULL};
    int status, n_outputs = 0, out0_index = -1, k;

    for (int i = 0; i < N_VALUES; i++)
        fp32_to_le(values[i], input + 4 * i);

    buf_str(&b, "{\"type\": \"infer\", \"protocol\": 1, \"id\": \"" REQUEST_ID "\", \"model_name\": ");
    buf_json_string(&b, model);
    buf_str(&b, ", \"model_version\": \"\", "
                "\"inputs\": [{\"name\": \"INPUT0\", \"datatype\": \"FP32\", \"shape\": [4]}], "
                "\"outputs\": [{\"name\": \"OUTPUT0\"}], \"parameters\": {}}");
    if (b.overflow) {
        errorf("the model name is too long");
        return EXIT_LOCAL;
    }
    if ((status = send_frame(sock, b.data, b.len, ZMQ_SNDMORE)) != 0 ||
        (status = send_frame(sock, input, sizeof input, 0)) != 0)
        return status;
    if ((status = recv_reply(sock, &r)) != 0 || (status = check_envelope(&r, "infer", &top)) != 0)
        goto done;

    /* Find OUTPUT0 in "outputs"; its bytes are frame 1 + its index there. */
    status = EXIT_MISMATCH;
    if (json_get(&top, "outputs", &outs) != 1 || json_array_open(&outs) != 0) {
        errorf("the response has no \"outputs\" list");
        goto done;
    }
    while ((k = json_array_next(&outs, &elem, 0)) == 1) {
        char name[KEY_MAX];
        if (!json_member_string(&elem, "name", name, sizeof name)) {
            errorf("output %d has no readable \"name\"", n_outputs);
            goto done;
        }
        if (strcmp(name, "OUTPUT0") == 0 && out0_index < 0) {
            out0_index = n_outputs;
            out0 = elem;
        }
        n_outputs++;
    }
    if (k != 0 || out0_index < 0) {
        errorf("OUTPUT0 is not among the response's outputs");
        goto done;
    }
    if (r.n != 1 + n_outputs) {
        errorf("the header lists %d outputs but %d tensor frames came", n_outputs, r.n - 1);
        goto done;
    }
    {
        char datatype[KEY_MAX];
        Json shape, dim;
        long long d0 = -1, d;
        int rank = 0;
        if (!json_member_string(&out0, "datatype", datatype, sizeof datatype) ||
            strcmp(datatype, "FP32") != 0) {
            errorf("OUTPUT0's datatype is not FP32");
            goto done;
        }
        if (json_get(&out0, "shape", &shape) != 1 || json_array_open(&shape) != 0) {
            errorf("OUTPUT0 has no shape list");
            goto done;
        }
        while ((k = json_array_next(&shape, &dim, 0)) == 1) {
            if (!json_get_int(&dim, &d)) {
                k = -1;
                break;
            }
            if (rank++ == 0)
                d0 = d;
        }
        if (k != 0 || rank != 1 || d0 != N_VALUES) {
            errorf("OUTPUT0's shape is not [%d]", N_VALUES);
            goto done;
        }
    }
    {
        zmq_msg_t *frame = &r.frames[1 + out0_index];
        const unsigned char *data = zmq_msg_data(frame);
        size_t size = zmq_msg_size(frame);
        if (size != sizeof input) {
            errorf("OUTPUT0 has %zu bytes, expected %zu", size, sizeof input);
            goto done;
        }
        printf("OUTPUT0 =");
        for (int i = 0; i < N_VALUES; i++)
            printf(" %g", (double)fp32_from_le(data + 4 * i));
        printf("\n");
        if (memcmp(data, input, sizeof input) != 0) {
            errorf("OUTPUT0 differs from INPUT0 (1.5 2.5 3.5 4.5)");
            goto done;
        }
    }
    printf("OK\n");
    status = EXIT_MATCH;
done:
    reply_close(&r);
    return status;
}

static int do_health(void *sock)
{
    static const char request[] =
        "{\"type\": \"health_ready\", \"protocol\": 1, \"id\": \"" REQUEST_ID "\"}";
    Reply r = {.n = 0};
    Json top, v;
    int status, ready;

    if ((status = send_frame(sock, request, sizeof request - 1, 0)) != 0)
        return status;
    if ((status = recv_reply(sock, &r)) != 0 ||
        (status = check_envelope(&r, "health_ready", &top)) != 0)
        goto done;
    if (json_get(&top, "ready", &v) != 1 || !json_get_bool(&v, &ready)) {
        errorf("the response has no boolean \"ready\"");
        status = EXIT_MISMATCH;
        goto done;
    }
    printf("%s\n", ready ? "true" : "false");
    status = ready ? EXIT_MATCH : EXIT_MISMATCH;
done:
    reply_close(&r);
    return status;
}

/* ======================================================================================
 * The lane mode (docs/PROTOCOL.md, "Lanes"): the request and its response go through two
 * rings in shared memory between this process and the model's worker; the broker only
 * grants the lane. Everything below is the protocol's byte layout, little-endian.
 * ==================================================================================== */

#define LANE_HEADER 4096
#define LANE_STATE 16          /* u32: 0 open, 1 revoked */
#define LANE_REQ_SEQ 64        /* u32 futex: requests posted (this process writes it) */
#define LANE_WORKER_SLEEPING 132
#define LANE_RESP_SEQ 128      /* u32 futex: responses posted (the worker writes it) */
#define LANE_CLIENT_SLEEPING 68
#define LANE_WORKER_CLOSED 140
#define LANE_REASON 512
#define DT_FP32 11             /* Triton's TRITONSERVER_DataType numbers */
#define SPIN_NS 50000          /* spin this long for the response, then sleep on the futex */

typedef struct {
    void *addr;
    size_t size;
} Mapping;

/* Map POSIX shared-memory object `key` ("/name"): 0, or an exit status. */
static int map_object(const char *key, int writable, Mapping *m)
{
    struct stat st;
    int fd = shm_open(key, writable ? O_RDWR : O_RDONLY, 0);
    if (fd < 0) {
        errorf("cannot open shared memory %s: %s", key, strerror(errno));
        return EXIT_LOCAL;
    }
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        errorf("cannot size shared memory %s", key);
        close(fd);
        return EXIT_LOCAL;
    }
    m->size = (size_t)st.st_size;
    m->addr = mmap(NULL, m->size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    close(fd);
    if (m->addr == MAP_FAILED) {
        errorf("cannot map shared memory %s: %s", key, strerror(errno));
        m->addr = NULL;
        return EXIT_LOCAL;
    }
    return 0;
}

static void unmap(Mapping *m)
{
    if (m->addr != NULL)
        munmap(m->addr, m->size);
    m->addr = NULL;
}

static _Atomic uint32_t *word(const Mapping *m, size_t offset)
{
    return (_Atomic uint32_t *)((char *)m->addr + offset);
}

static void put_u16(unsigned char *p, unsigned v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static unsigned get_u16(const unsigned char *p) { return (unsigned)p[0] | (unsigned)p[1] << 8; }

/* Send a control message and check its answer's envelope: 0 (r holds it), or an exit status. */
static int control(void *sock, const Buf *b, const char *type, Reply *r, Json *top)
{
    int status;
    if (b->overflow) {
        errorf("a %s message does not fit the buffer", type);
        return EXIT_LOCAL;
    }
    if ((status = send_frame(sock, b->data, b->len, 0)) != 0)
        return status;
    if ((status = recv_reply(sock, r)) != 0)
        return status;
    return check_envelope(r, type, top);
}

/* The position of string `name` in the array member `key` of *top (elements are strings, or
 * objects whose "name" is compared): the index, or -1. */
static int position(const Json *top, const char *key, const char *name)
{
    Json arr, elem;
    char got[KEY_MAX];
    int i = 0;
    if (json_get(top, key, &arr) != 1 || json_array_open(&arr) != 0)
        return -1;
    while (json_array_next(&arr, &elem, 0) == 1) {
        if ((json_get_string(&elem, got, sizeof got) || json_member_string(&elem, "name", got, sizeof got)) &&
            strcmp(got, name) == 0)
            return i;
        i++;
    }
    return -1;
}

static int member_int(const Json *obj, const char *key, long long *out)
{
    Json v;
    return json_get(obj, key, &v) == 1 && json_get_int(&v, out);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void futex_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static void futex_wait(_Atomic uint32_t *w, uint32_t seen, long ns)
{
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* Wait until response 1 is in the ring: 0, or an exit status (revoked, closed, timed out). */
static int lane_wait(const Mapping *lane)
{
    _Atomic uint32_t *seq = word(lane, LANE_RESP_SEQ), *sleeping = word(lane, LANE_CLIENT_SLEEPING);
    uint64_t start = now_ns(), limit = timeout_ms < 0 ? UINT64_MAX : (uint64_t)timeout_ms * 1000000u;
    while (atomic_load_explicit(seq, memory_order_acquire) == 0) {
        uint64_t spent = now_ns() - start;
        if (atomic_load(word(lane, LANE_STATE)) != 0 || atomic_load(word(lane, LANE_WORKER_CLOSED)) != 0) {
            if (atomic_load_explicit(seq, memory_order_acquire) != 0)
                break;
            errorf("the lane ended: %.511s", (const char *)lane->addr + LANE_REASON);
            return EXIT_SERVER_ERROR;
        }
        if (spent > limit) {
            report_timeout("waiting on the lane of");
            return EXIT_TIMEOUT;
        }
        if (spent < SPIN_NS)
            continue;
        /* Raise the flag, then sleep while the word is still 0 (the kernel checks it after
         * its own barrier): the worker, having published, looks at the flag and wakes us. */
        atomic_store(sleeping, 1);
        futex_wait(seq, 0, 50000000L); /* 50 ms slices: the state is looked at again */
        atomic_store(sleeping, 0);
    }
    return 0;
}

static int do_lane(void *sock, const char *model)
{
    static const float values[N_VALUES] = {1.5f, 2.5f, 3.5f, 4.5f};
    Buf b = {.len = 0, .overflow = 0};
    Reply r = {.n = 0};
    Json top;
    Mapping inputs = {NULL, 0}, lane = {NULL, 0}, outputs = {NULL, 0};
    char key[256], lane_key[256], out_key[256];
    long long lane_id = 0, slots, slot_size;
    int status, in_index, out_index;
    unsigned char *req, *resp, *p;

    /* 1. A server-made input region, and the input written into it in place. */
    buf_str(&b, "{\"type\": \"create_shared_memory_region\", \"protocol\": 1, \"id\": \"" REQUEST_ID
                "\", \"name\": \"inputs\", \"byte_size\": 4096}");
    if ((status = control(sock, &b, "create_shared_memory_region", &r, &top)) != 0)
        goto done;
    if (!json_member_string(&top, "key", key, sizeof key)) {
        errorf("create_shared_memory_region answered no key");
        status = EXIT_MISMATCH;
        goto done;
    }
    reply_close(&r);
    if ((status = map_object(key, 1, &inputs)) != 0)
        goto done;
    for (int i = 0; i < N_VALUES; i++)
        fp32_to_le(values[i], (unsigned char *)inputs.addr + 4 * i);

    /* 2. The lane. */
    b.len = 0;
    buf_str(&b, "{\"type\": \"open_lane\", \"protocol\": 1, \"id\": \"" REQUEST_ID "\", \"model_name\": ");
    buf_json_string(&b, model);
    {
        char tail[96];
        snprintf(tail, sizeof tail, ", \"model_version\": \"\", \"pid\": %ld, \"slots\": 1}", (long)getpid());
        buf_str(&b, tail);
    }
    if ((status = control(sock, &b, "open_lane", &r, &top)) != 0)
        goto done;
    status = EXIT_MISMATCH;
    in_index = position(&top, "inputs", "INPUT0");
    out_index = position(&top, "outputs", "OUTPUT0");
    if (!json_member_string(&top, "key", lane_key, sizeof lane_key) ||
        !json_member_string(&top, "output_region", out_key + 1, sizeof out_key - 1) ||
        !member_int(&top, "lane", &lane_id) || !member_int(&top, "slots", &slots) ||
        !member_int(&top, "slot_size", &slot_size) || in_index < 0 || out_index < 0) {
        errorf("open_lane's answer lacks a field of the protocol");
        goto done;
    }
    out_key[0] = '/';
    reply_close(&r);
    if ((status = map_object(lane_key, 1, &lane)) != 0)
        goto done;
    status = EXIT_MISMATCH;
    if (memcmp(lane.addr, "IPL1", 4) != 0 || get_u32((unsigned char *)lane.addr + 4) != 1 ||
        lane.size < (size_t)(LANE_HEADER + 2 * slots * slot_size)) {
        errorf("%s is not a version 1 lane", lane_key);
        goto done;
    }

    /* 3. Request 0 into request slot 0: the header, INPUT0, the one output wanted. */
    req = (unsigned char *)lane.addr + LANE_HEADER;
    memset(req, 0, 128);
    put_u64(req, 0);                 /* id */
    put_u64(req + 8, now_ns());      /* sent */
    put_u32(req + 16, 0);            /* flags */
    put_u16(req + 20, 1);            /* inputs */
    put_u16(req + 22, 1);            /* outputs */
    put_u16(req + 24, 0);            /* releases */
    put_u32(req + 28, 40);           /* the body: one input entry (32), one output index (8) */
    p = req + 32;                    /* the input: index, datatype, ndim, offset, size, dims */
    put_u16(p, (unsigned)in_index);
    p[2] = DT_FP32;
    p[3] = 1;
    put_u64(p + 8, 0);
    put_u64(p + 16, 4 * N_VALUES);
    put_u64(p + 24, N_VALUES);
    put_u16(p + 32, (unsigned)out_index);
    /* Publish (a release store), then wake the worker if it sleeps: the full fence orders the
     * store before the load of its flag. */
    atomic_store_explicit(word(&lane, LANE_REQ_SEQ), 1, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(word(&lane, LANE_WORKER_SLEEPING)))
        futex_wake(word(&lane, LANE_REQ_SEQ));

    /* 4. Response 0, in response slot 0. */
    if ((status = lane_wait(&lane)) != 0)
        goto done;
    status = EXIT_MISMATCH;
    resp = (unsigned char *)lane.addr + LANE_HEADER + slots * slot_size;
    if (get_u32(resp + 8) != 0) {
        unsigned len = get_u16(resp + 16);
        const char *codes[] = {"", "INVALID_ARG", "NOT_FOUND", "UNAVAILABLE", "UNSUPPORTED",
                               "INTERNAL", "ALREADY_EXISTS", "CANCELLED", "TIMEOUT", "UNKNOWN"};
        uint32_t code = get_u32(resp + 8);
        unsigned n_out = get_u16(resp + 12);
        const unsigned char *msg = resp + 24;
        for (unsigned i = 0; i < n_out; i++)
            msg += 24 + 8 * msg[3];
        msg += get_u32(resp + 20); /* the parameters */
        errorf("server error %s: %.*s", code < 10 ? codes[code] : "UNKNOWN", (int)len, (const char *)msg);
        status = EXIT_SERVER_ERROR;
        goto done;
    }
    p = resp + 24;
    if (get_u16(resp + 12) != 1 || get_u16(p) != (unsigned)out_index || p[2] != DT_FP32 || p[3] != 1 ||
        get_u64(p + 24) != N_VALUES || get_u64(p + 16) != 4 * N_VALUES) {
        errorf("the lane's response is not OUTPUT0, FP32 [%d]", N_VALUES);
        goto done;
    }
    if ((status = map_object(out_key, 0, &outputs)) != 0)
        goto done;
    status = EXIT_MISMATCH;
    if (get_u64(p + 8) + 4 * N_VALUES > outputs.size) {
        errorf("OUTPUT0 lies outside %s", out_key);
        goto done;
    }
    {
        const unsigned char *data = (const unsigned char *)outputs.addr + get_u64(p + 8);
        printf("OUTPUT0 =");
        for (int i = 0; i < N_VALUES; i++)
            printf(" %g", (double)fp32_from_le(data + 4 * i));
        printf("\n");
        if (memcmp(data, inputs.addr, 4 * N_VALUES) != 0) {
            errorf("OUTPUT0 differs from INPUT0 (1.5 2.5 3.5 4.5)");
            goto done;
        }
    }

    /* 5. Close the lane: the worker gives back OUTPUT0's memory, the broker unlinks the lane. */
    b.len = 0;
    {
        char msg[128];
        snprintf(msg, sizeof msg, "{\"type\": \"close_lane\", \"protocol\": 1, \"id\": \"" REQUEST_ID
                 "\", \"lane\": %lld}", lane_id);
        buf_str(&b, msg);
    }
    if ((status = control(sock, &b, "close_lane", &r, &top)) != 0)
        goto done;
    printf("OK (lane)\n");
    status = EXIT_MATCH;
done:
    reply_close(&r);
    unmap(&outputs);
    unmap(&lane);
    unmap(&inputs);
    return status;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: %s ENDPOINT [MODEL] [--health | --lane]\n"
            "  ENDPOINT  e.g. ipc:///tmp/inferpool-$(id -u)/broker.sock or tcp://127.0.0.1:8710\n"
            "  MODEL     model to infer on (default: identity)\n"
            "  --health  send health_ready instead and print `ready`\n"
            "  --lane    infer through a lane (same machine as the server)\n"
            "env INFERPOOL_TIMEOUT_MS: send/receive timeout (default %d, -1 = forever)\n",
            prog, DEFAULT_TIMEOUT_MS);
    return EXIT_LOCAL;
}

int main(int argc, char **argv)
{
    const char *model = "identity", *env;
    int health = 0, lane = 0, linger = 0, status;
    void *ctx, *sock;

    if (argc < 2 || argc > 4 || argv[1][0] == '-')
        return usage();
    endpoint = argv[1];
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--health") == 0 && i == argc - 1)
            health = 1;
        else if (strcmp(argv[i], "--lane") == 0 && i == argc - 1)
            lane = 1;
        else if (i == 2 && argv[i][0] != '-')
            model = argv[i];
        else
            return usage();
    }
    if ((env = getenv("INFERPOOL_TIMEOUT_MS")) != NULL && *env != '\0') {
        char *endp;
        long t;
        errno = 0;
        t = strtol(env, &endp, 10);
        if (errno != 0 || *endp != '\0' || t < -1 || t > 24L * 3600 * 1000) {
            errorf("INFERPOOL_TIMEOUT_MS must be an integer number of ms (or -1), got \"%s\"", env);
            return EXIT_LOCAL;
        }
        timeout_ms = (int)t;
    }

    if ((ctx = zmq_ctx_new()) == NULL) {
        zmq_failed("zmq_ctx_new");
        return EXIT_LOCAL;
    }
    if ((sock = zmq_socket(ctx, ZMQ_REQ)) == NULL) {
        zmq_failed("zmq_socket");
        status = EXIT_LOCAL;
        goto term;
    }
    /* LINGER 0: never block at exit on a request the server did not take. */
    if (zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms) != 0) {
        zmq_failed("zmq_setsockopt");
        status = EXIT_LOCAL;
        goto close;
    }
    if (zmq_connect(sock, endpoint) != 0) {
        errorf("cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
        status = EXIT_LOCAL;
        goto close;
    }

    status = health ? do_health(sock) : lane ? do_lane(sock, model) : do_infer(sock, model);

close:
    if (zmq_close(sock) != 0)
        zmq_failed("zmq_close");
term:
    while (zmq_ctx_term(ctx) != 0) {
        if (zmq_errno() != EINTR) {
            zmq_failed("zmq_ctx_term");
            break;
        }
    }
    if (fflush(stdout) != 0 && status == EXIT_MATCH)
        status = EXIT_LOCAL;
    return status;
}
