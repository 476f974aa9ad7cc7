/* sim_rng.h - the simulator's one source of randomness: splitmix64, so
 * that a seed replays exactly on every machine. */
#ifndef BEANGATE_SIM_RNG_H
#define BEANGATE_SIM_RNG_H

#include <stdint.h>

struct sim_rng {
    uint64_t state;
};

static inline uint64_t rng_next(struct sim_rng *r)
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) (n > 0). */
static inline uint64_t rng_below(struct sim_rng *r, uint64_t n) { return rng_next(r) % n; }

/* 1 with probability ppm parts per million. */
static inline int rng_ppm(struct sim_rng *r, uint32_t ppm) { return ppm && rng_below(r, 1000000) < ppm; }

#endif
