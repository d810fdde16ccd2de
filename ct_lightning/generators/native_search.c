/* The packed active-rows loop's own work, two calls per search iteration (native_search.py).
 *
 * Per iteration the library's PyTorch code runs the model's passes and the softmax; this file does the rest over the
 * packed rows: the penalty's and the loss's gradient at the target's logit and the rows' tau-convergence
 * (search_logits), then (search_iteration) the points' l-infinity distances from their factuals (the
 * nascent epsilon-ball test), freezing the rows that converged, the l1 cost's gradient, the mutability mask, the SGD
 * step, the projection onto the domain and mutability (in place), and dropping frozen rows from the packing (at once:
 * each kept row's step writes it into its packed place). It follows search.py's _search_packed and FeatureSpace
 * operation for operation, each rounded as PyTorch's kernel rounds it (built with -ffp-contract=off: no fused
 * multiply-add), so the results are the same to the bit where that loop packs the rows alike.
 *
 * The body below is compiled twice, for float (T = float, suffix _f32) and double (_f64): this file includes itself.
 */
#ifndef T
#include <stdint.h>
#include <string.h>

/* Mutability codes per feature (constraints.py: both, increase, decrease, none). */
enum { BOTH = 0, INCREASE = 1, DECREASE = 2, NONE = 3 };

typedef struct {
    int64_t n, d;             /* pool rows, features per row */
    int64_t m, n_searching;   /* packed rows, packed rows that have not frozen */
    double lr, epsilon;
    double repack_share;      /* frozen rows are dropped from the packing once they are this share of it (0: at once) */
    const void *x;            /* the pool's factuals (n x d): packed row i's is row active[i] */
    void *rows_x;             /* packed factuals (n x d, the first m rows in use) where the caller snaps, else NULL */
    int64_t *target;          /* packed target classes */
    int64_t *active;          /* packed row -> pool row */
    uint8_t *searching;       /* packed row has not frozen */
    uint8_t *was_inside;      /* packed row's previous point lay within epsilon */
    void *distance;           /* packed row's next point's distance (as bits, see below), from the step */
    void *scratch;            /* one row's next point, before it replaces the row's point (d values) */
    void *x_cf, *nascent;     /* outputs (n x d) */
    int64_t *nascent_steps, *steps;
    uint8_t *converged;
    const void *lower, *upper; /* per feature (-inf and inf where unbounded) */
    const void *codes;         /* per feature, an integer as wide as T */
} Search;

#define T float
#define BITS uint32_t
#define NAME(name) name##_f32
#include __FILE__
#undef T
#undef BITS
#undef NAME

#define T double
#define BITS uint64_t
#define NAME(name) name##_f64
#include __FILE__

#else

/* |v| as the bits of its IEEE value: for values without a sign the bits order as the values do, and a NaN's bits
   exceed every number's. So the largest bits of a row's |offsets| are its l-infinity distance, NaN if any offset is
   (as torch.amax), and an integer maximum, which vectorises where a float one with NaN rules does not. */
static inline BITS NAME(magnitude_bits)(T v) {
    BITS bits;
    memcpy(&bits, &v, sizeof bits);
    return bits & ~((BITS)1 << (8 * sizeof(BITS) - 1));
}

static inline T NAME(from_bits)(BITS bits) {
    T v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* Packed row i's factual. */
static inline const T *NAME(factual)(const Search *s, int64_t i) {
    return (const T *)s->x + s->active[i] * s->d;
}

static BITS NAME(distance_bits)(const T *p, const T *x, int64_t d) {
    BITS largest = 0;
    for (int64_t j = 0; j < d; j++) {
        BITS bits = NAME(magnitude_bits)(p[j] - x[j]);
        largest = bits > largest ? bits : largest;
    }
    return largest;
}

/* The epsilon-ball test of the points (their distances from the step before when `known`), and rows leaving the ball:
   their previous point is their nascent counterfactual so far (search.py: record_nascent of `leaving`). */
static void NAME(inside)(Search *s, const T *points, const T *previous, int known, int64_t step) {
    const int64_t d = s->d;
    const T epsilon = (T)s->epsilon;
    BITS *distance = (BITS *)s->distance;
    T *nascent = (T *)s->nascent;
    for (int64_t i = 0; i < s->m; i++) {
        BITS bits = known ? distance[i] : NAME(distance_bits)(points + i * d, NAME(factual)(s, i), d);
        uint8_t now = NAME(from_bits)(bits) <= epsilon;
        if (previous && s->was_inside[i] && !now && s->searching[i]) {
            int64_t id = s->active[i];
            memcpy(nascent + id * d, previous + i * d, d * sizeof(T));
            s->nascent_steps[id] = step - 1;
        }
        s->was_inside[i] = now; /* row i's old flag was read above */
    }
}

/* Packed row i converged at `step` with its point (search.py: freeze). */
static void NAME(freeze)(Search *s, const T *points, int64_t i, int64_t step) {
    const int64_t d = s->d, id = s->active[i];
    memcpy((T *)s->x_cf + id * d, points + i * d, d * sizeof(T));
    if (s->was_inside[i]) {
        memcpy((T *)s->nascent + id * d, points + i * d, d * sizeof(T));
        s->nascent_steps[id] = step;
    }
    s->steps[id] = step;
    s->converged[id] = 1;
}

/* One constrained SGD step of row i (constraints.py: Constraints.step after search.py's _add_cost):
   g + lambda*sign(v - x) (only `with_cost`: adding 0 could turn a -0 into +0), the mutability mask, v - lr*g, the
   domain clamp, mutability from x; then the new point's distance from x. One pass of selects, no branches, so that
   it vectorises; features without bounds have infinite ones and features without a code are BOTH, which give the
   same values as no clamp and no mask. */
static inline __attribute__((always_inline)) void NAME(step_row)(const Search *s, const T *v, const T *g,
                                                               const T *x, T *out, T lambda_cost, const int with_cost,
                                                               BITS *distance) {
    const int64_t d = s->d;
    const T lr = (T)s->lr;
    const T *lower = (const T *)s->lower, *upper = (const T *)s->upper;
    const BITS *codes = (const BITS *)s->codes;
    BITS largest = 0;
    for (int64_t j = 0; j < d; j++) {
        T gradient = g[j];
        if (with_cost) {
            T offset = v[j] - x[j];
            T sign = (T)(offset > 0) - (T)(offset < 0);
            gradient = gradient + lambda_cost * sign;
        }
        BITS code = codes[j];
        int forbidden = (code == NONE) | ((code == INCREASE) & (gradient > 0)) | ((code == DECREASE) & (gradient < 0));
        gradient = forbidden ? 0 : gradient;
        T moved = gradient * lr;
        T value = v[j] - moved;
        value = value < lower[j] ? lower[j] : value; /* NaN stays NaN, as in torch.clamp */
        value = value > upper[j] ? upper[j] : value;
        /* torch.maximum / torch.minimum against x: NaN stays, a tie gives x */
        int keep = (code == BOTH) | ((code == INCREASE) & ((value > x[j]) | (value != value))) |
                   ((code == DECREASE) & ((value < x[j]) | (value != value)));
        value = keep ? value : x[j];
        out[j] = value; /* out may be v: each value is read before it is written */
        BITS bits = NAME(magnitude_bits)(value - x[j]);
        largest = bits > largest ? bits : largest;
    }
    *distance = largest;
}

/* Step packed row i into packed row k <= i (i itself, or its place after dropping the frozen rows before it).
   `detect` (the points are the rows themselves): a row within epsilon whose next point lies outside leaves the ball
   at this step, and its point now is its nascent counterfactual so far (search.py: record_nascent of `leaving` at the
   next iteration, done here before the point is overwritten). */
static void NAME(advance)(Search *s, T *rows, const T *grad, int64_t i, int64_t k, T lambda_cost, int detect,
                          int64_t step) {
    const int64_t d = s->d;
    const T *v = rows + i * d, *g = grad + i * d, *x = NAME(factual)(s, i);
    T *out = rows + k * d;
    BITS *distance = (BITS *)s->distance + k;
    if (detect && s->was_inside[i]) {
        T *next = (T *)s->scratch;
        if (lambda_cost != 0) NAME(step_row)(s, v, g, x, next, lambda_cost, 1, distance);
        else NAME(step_row)(s, v, g, x, next, lambda_cost, 0, distance);
        if (!(NAME(from_bits)(*distance) <= (T)s->epsilon)) {
            int64_t id = s->active[i];
            memcpy((T *)s->nascent + id * d, v, d * sizeof(T));
            s->nascent_steps[id] = step;
        }
        memcpy(out, next, d * sizeof(T));
    } else if (lambda_cost != 0)
        NAME(step_row)(s, v, g, x, out, lambda_cost, 1, distance);
    else
        NAME(step_row)(s, v, g, x, out, lambda_cost, 0, distance);
}

/* Packed row i becomes packed row k < i (its next point and distance are already there): its factual where they are
   packed, its current point where the points are not the rows, and its bookkeeping. */
static void NAME(move_row)(Search *s, int64_t i, int64_t k, T *rows, T *points) {
    const int64_t d = s->d;
    if (s->rows_x) memcpy((T *)s->rows_x + k * d, (T *)s->rows_x + i * d, d * sizeof(T));
    if (points != rows) memcpy(points + k * d, points + i * d, d * sizeof(T));
    s->target[k] = s->target[i];
    s->active[k] = s->active[i];
    s->was_inside[k] = s->was_inside[i];
    s->searching[k] = 1;
}

/* The loss's gradient at the logits, in place of the probabilities `probs` (softmax of the packed rows' logits
   `logits`, element (i, c) at i * row_stride + c * class_stride, and at i * logit_row + c * logit_class): the
   target's probability minus 1 plus the penalty's gradient at the target's logit, and whether that probability
   reaches tau into `done` (search.py: _logit_gradient). The penalty's gradient: 0 where `energy` is 0 (Generic), else
   ECCo's scale * (1 + slope * E) with the energy E = -logit (feature_space.py: ECCo.energy_gradient). */
void NAME(search_logits)(Search *s, T *probs, int64_t row_stride, int64_t class_stride, const T *logits,
                         int64_t logit_row, int64_t logit_class, int64_t energy, double scale, double slope,
                         uint8_t *done, double tau) {
    const T threshold = (T)tau, a = (T)scale, b = (T)slope;
    for (int64_t i = 0; i < s->m; i++) {
        const int64_t c = s->target[i];
        T *p = probs + i * row_stride + c * class_stride;
        done[i] = *p >= threshold;
        T delta = (T)-1;
        if (energy) {
            T e = -logits[i * logit_row + c * logit_class];
            T inner = b * e;
            inner = (T)1 + inner;
            delta = a * inner - (T)1;
        }
        *p = *p + delta;
    }
}

/* One iteration after the passes. `points`: the packed rows' points (`rows` itself where nothing snaps them, and then
   their distances are known from the step before unless `step` is 0); `previous`: the points of the iteration before
   (NULL at the first, and where `points` is `rows`: the step itself finds the rows leaving the epsilon-ball);
   `grad`: the model's input gradient; `done`: the
   rows' convergence (overwritten); `lambda_cost`: the l1 cost's weight. Steps `rows` in place and returns how many
   packed rows remain: the first rows of rows, rows_x, target and points; -1 when the search
   is over. */
int64_t NAME(search_iteration)(Search *s, T *rows, T *points, const T *previous, const T *grad, uint8_t *done,
                               int64_t step, double lambda_cost) {
    const int64_t m = s->m;
    NAME(inside)(s, points, previous, points == rows && step > 0, step);
    int64_t n_done = 0;
    for (int64_t i = 0; i < m; i++) {
        done[i] = done[i] && s->searching[i];
        n_done += done[i];
    }
    for (int64_t i = 0; n_done && i < m; i++)
        if (done[i]) {
            NAME(freeze)(s, points, i, step);
            s->searching[i] = 0;
        }
    s->n_searching -= n_done;
    if (s->n_searching == 0) return -1;
    /* Dropping the frozen rows (stably) costs nothing extra here: each row's step writes its next point into its
       packed place. A frozen row still packed is never read again: it keeps its point. */
    const int repack = m > s->n_searching && (double)(m - s->n_searching) >= s->repack_share * (double)m;
    int64_t kept = 0;
    for (int64_t i = 0; i < m; i++) {
        if (!s->searching[i]) continue;
        int64_t k = repack ? kept++ : i;
        NAME(advance)(s, rows, grad, i, k, (T)lambda_cost, points == rows, step);
        if (k != i) NAME(move_row)(s, i, k, rows, points);
    }
    if (repack) s->m = kept;
    return s->m;
}

/* The check after the last step: the rows still searching take their points and convergence `done`. */
void NAME(search_finish)(Search *s, const T *rows, T *points, const T *previous, const uint8_t *done, int64_t step) {
    NAME(inside)(s, points, previous, points == rows && step > 0, step);
    const int64_t d = s->d;
    for (int64_t i = 0; i < s->m; i++) {
        if (!s->searching[i]) continue;
        int64_t id = s->active[i];
        s->converged[id] = done[i] != 0;
        memcpy((T *)s->x_cf + id * d, points + i * d, d * sizeof(T));
        if (s->was_inside[i]) {
            memcpy((T *)s->nascent + id * d, points + i * d, d * sizeof(T));
            s->nascent_steps[id] = step;
        }
    }
}

#endif
