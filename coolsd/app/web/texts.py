"""The page's fixed words and style: the introduction, the table of methods under the trade-off figure, and the
CSS."""

INTRO = """
# coolsd: watch speculative decoding generate an image
A small **draft** model proposes the next few image tokens; the big **target** model checks them all in
one forward pass and keeps a prefix. *Lossless* Eagle-1 accepts a draft `y` with probability
`min(1, p(y)/q(y))`, so the image has exactly the target's distribution. *Relaxed* methods accept more
(faster) at a measured distortion: **COOL-SD** multiplies the ratio by `omega_i = delta * exp(-nu*i - mu)`,
relaxing early draft positions more than late ones, and resamples rejections from the optimal residual `G*`.
A **Jacobi window** (`jacobi:16`, ...) needs no draft model: the target drafts its own next tokens from its
last forward (Eagle-1 on it is SJD; on `jacobi:16:coupled`, SCD), and every method runs on it.
Pick a method, move the sliders, and compare with the lossless image on the right.
"""
METHOD_NOTES = """
| method | accept draft `y` at position `i` with probability | after a rejection, sample from |
|---|---|---|
| AR | (no drafts: one target forward per token) | `p` |
| Eagle-1 | `min(1, p(y)/q(y))` | `Norm([p - q]_+)` (exact: the target's distribution) |
| UniformRSD | `min(1, delta * p(y)/q(y))` | `G* = Norm([p - q f]_+)` |
| COOL-SD | `min(1, omega_i * p(y)/q(y))`, `omega_i = delta * exp(-nu*i - mu)` | `G*` |
| LANTERN++ | `min(1, p~(y)/q(y))`, `p~(y) = p(y) + ` mass of up to `k` nearest codes, `p~ <= lambda * p` | heuristic: clear `q` near `y`, then `Norm([p - q]_+)` |
| LANTERN++ with G* | the same | `G*` |
| GSD | `min(1, p(G)/q(G))`, `G`: tokens within `ranks` ranks of `y` in `p`'s order, `p` within `gap` of `p(y)`, embeddings within `dist` | `Norm([p - q]_+)` |
| GSD with G* | the same | `G*` |

*mean accepted length* `tau` = image tokens / target forward passes (AR: 1). *Relaxation cost* sums, over
the tested drafts, the total-variation distance that step adds (`e = sum [q f - p]_+`); it is 0 for lossless
decoding. `mu = auto` makes the mean of `omega_1..omega_L` equal `delta`, so COOL-SD and UniformRSD at the same
`delta` spend the same total relaxation.

The trade-off figure shows the shipped study: each setting's quality minus Eagle-1's with its paired 95% interval.
The grey band is the study's measured noise floor (AR minus Eagle-1 on the same images: both sample the target).
"""
TOUR_INTRO = ("{steps} steps through what the methods do, each with what our study of the shipped model measured. "
              "A step sets the controls and generates; then look where its text says.")
THEORY_INTRO = ("Exact per-position acceptance rate `beta_i`, TV cost `e_i`, expected accepted drafts `E[N]` and the "
                "bound on the total-variation distance of one round, under the current sliders: move them and watch "
                "the trade-off. For a chain, `E[N] = sum_i prod_{j<=i} beta_j` and the bound is "
                "`sum_i (prod_{j<i} beta_j) e_i`.")
CSS = """
.pixelated img, .race-picture img { image-rendering: pixelated; }
/* from a Generate click to its request's first output (events.HIDE_ON_CLICK) */
body.replaced #image-method img, body.replaced #image-eagle img, body.replaced #caption { visibility: hidden; }
#generate { position: sticky; bottom: 8px; z-index: 20; box-shadow: 0 2px 10px rgba(0, 0, 0, 0.25); }
.gradio-container { overflow: clip !important; }  /* clips as Gradio's "hidden" does, but lets #generate stick */
.timings table { width: 100%; font-size: 0.9em; }
.formulas table { display: block; overflow-x: auto; }  /* a phone scrolls it rather than break a name */
.formulas th, .formulas td { overflow-wrap: normal !important; word-break: normal !important; }
.formulas td:first-child { white-space: nowrap; }
.timings th, .timings td { white-space: normal; overflow-wrap: normal !important; word-break: normal !important;
                           padding: 4px 6px !important; }
"""
