package ycsb

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
)

// zipfianConstant is YCSB's default skew (ZipfianGenerator.ZIPFIAN_CONSTANT).
const zipfianConstant = 0.99

// zipfian draws item numbers in [0, n) with YCSB's ZipfianGenerator: item 0 is
// the most popular (Gray et al., "Quickly generating billion-record synthetic
// databases", SIGMOD 1994). n may grow (for the "latest" distribution); zeta is
// then extended incrementally, as YCSB does.
type zipfian struct {
	theta, alpha, zeta2 float64
	n                   uint64
	zetan, eta          float64
}

func newZipfian(n uint64) *zipfian {
	z := &zipfian{theta: zipfianConstant}
	z.alpha = 1 / (1 - z.theta)
	z.zeta2 = zetaRange(0, 2, z.theta, 0)
	z.grow(n)
	return z
}

// zetaRange returns initial + Σ_{i=from+1}^{to} 1/i^theta.
func zetaRange(from, to uint64, theta, initial float64) float64 {
	sum := initial
	for i := from + 1; i <= to; i++ {
		sum += 1 / math.Pow(float64(i), theta)
	}
	return sum
}

// grow extends the item count to n (never shrinks).
func (z *zipfian) grow(n uint64) {
	if n <= z.n {
		return
	}
	z.zetan = zetaRange(z.n, n, z.theta, z.zetan)
	z.n = n
	z.eta = (1 - math.Pow(2/float64(n), 1-z.theta)) / (1 - z.zeta2/z.zetan)
}

func (z *zipfian) next(r *rand.Rand) uint64 {
	u := r.Float64()
	uz := u * z.zetan
	if uz < 1 {
		return 0
	}
	if uz < 1+math.Pow(0.5, z.theta) {
		return 1
	}
	v := uint64(float64(z.n) * math.Pow(z.eta*u-z.eta+1, z.alpha))
	return min(v, z.n-1)
}

// fnv64 is YCSB's Utils.fnvhash64: FNV-1a over the 8 bytes of v, low byte first.
func fnv64(v uint64) uint64 {
	h := uint64(0xCBF29CE484222325)
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		h *= 1099511628211
		v >>= 8
	}
	return h
}

// scrambledItems and scrambledZetan are YCSB's ScrambledZipfianGenerator
// constants: a zipfian over 10^10 items, hashed onto the key space, so popular
// items are spread out instead of clustered at the start.
const (
	scrambledItems = 10_000_000_000
	scrambledZetan = 26.46902820178302
)

// Chooser picks the key number of the next operation on existing records.
type Chooser interface {
	// Next returns a key number in [0, inserted).
	Next(r *rand.Rand, inserted uint64) uint64
}

type uniform struct{}

func (uniform) Next(r *rand.Rand, inserted uint64) uint64 { return r.Uint64N(max(inserted, 1)) }

// scrambledZipfian is YCSB's "zipfian" request distribution.
type scrambledZipfian struct{ z *zipfian }

func newScrambledZipfian() scrambledZipfian {
	z := &zipfian{theta: zipfianConstant, alpha: 1 / (1 - zipfianConstant), n: scrambledItems, zetan: scrambledZetan}
	z.zeta2 = zetaRange(0, 2, z.theta, 0)
	z.eta = (1 - math.Pow(2/float64(z.n), 1-z.theta)) / (1 - z.zeta2/z.zetan)
	return scrambledZipfian{z: z}
}

func (s scrambledZipfian) Next(r *rand.Rand, inserted uint64) uint64 {
	return fnv64(s.z.next(r)) % max(inserted, 1)
}

// latest is YCSB's SkewedLatestGenerator: the newest records are the most
// popular. Each worker has its own (the zipfian grows with the inserts).
type latest struct{ z *zipfian }

func (l *latest) Next(r *rand.Rand, inserted uint64) uint64 {
	inserted = max(inserted, 1)
	l.z.grow(inserted)
	return inserted - 1 - l.z.next(r)%inserted
}

// counter hands out new key numbers for inserts.
type counter struct{ next atomic.Uint64 }

func (c *counter) take() uint64 { return c.next.Add(1) - 1 }
