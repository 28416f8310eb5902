// Kernels that finish chunks nvCOMP decoded (issue 32, docs/gpu-decode.md): the
// Adler-32 check of HDF5's deflate filter and the unshuffle of its shuffle filter.
// Compiled to PTX for compute_75 by tests/gpu/build_kernels.sh (nvcc, on a machine with
// CUDA); the PTX next to this file is what the decoder process loads.

// One entry per chunk: device addresses and sizes (src/gpu/decoder_proc.rs `Post`).
struct Post {
    unsigned long long src;   // decoded bytes (shuffled when es > 1)
    unsigned long long dst;   // where the unshuffled bytes go (unused when es == 0)
    unsigned long long len;   // bytes
    unsigned long long es;    // shuffle element size; 0: no unshuffle; bit 32 set: a bit
                              // unshuffle (bitshuffle's transpose) of elements of the low
                              // bits' size
    unsigned long long want;  // Adler-32 expected in the low 32 bits; bit 32 set: none
};

#define MOD_ADLER 65521ull

// Block k computes the Adler-32 of posts[k]'s decoded bytes into got[k]. Thread t sums
// bytes t, t + blockDim.x, ...: s = sum of bytes, w = sum of (len - i) * byte; then
// A = 1 + s, B = len + w (mod 65521). No overflow: w < 2^24 * 255 * 2^16 per thread for
// chunks of up to 16 MiB.
extern "C" __global__ void h5t_adler32(const Post* posts, unsigned int* got) {
    const Post p = posts[blockIdx.x];
    if (p.want >> 32) {
        return;
    }
    const unsigned char* d = (const unsigned char*)p.src;
    const unsigned long long n = p.len;
    unsigned long long s = 0, w = 0;
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
        const unsigned long long b = d[i];
        s += b;
        w += (n - i) * b;
    }
    __shared__ unsigned long long ss[256], ww[256];
    ss[threadIdx.x] = s % MOD_ADLER;
    ww[threadIdx.x] = w % MOD_ADLER;
    __syncthreads();
    for (unsigned int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            ss[threadIdx.x] = (ss[threadIdx.x] + ss[threadIdx.x + k]) % MOD_ADLER;
            ww[threadIdx.x] = (ww[threadIdx.x] + ww[threadIdx.x + k]) % MOD_ADLER;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const unsigned long long a = (1 + ss[0]) % MOD_ADLER;
        const unsigned long long b = (n % MOD_ADLER + ww[0]) % MOD_ADLER;
        got[blockIdx.x] = (unsigned int)((b << 16) | a);
    }
}

// posts[blockIdx.y]: HDF5's shuffle undone, src -> dst (byte j of element i was stored
// at j * n + i; the len % es bytes after the n whole elements stay as they are). With
// bit 32 of es: bitshuffle's bit transpose undone (n a multiple of 8: row 8j + t of n/8
// bytes holds bit t of byte j of every element, element e at bit e % 8 of byte e / 8).
extern "C" __global__ void h5t_unshuffle(const Post* posts) {
    const Post p = posts[blockIdx.y];
    if (p.es == 0) {
        return;
    }
    const unsigned char* s = (const unsigned char*)p.src;
    unsigned char* d = (unsigned char*)p.dst;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    if (p.es >> 32) {
        const unsigned long long es = p.es & 0xffffffffull, n = p.len / es, nrow = n / 8;
        for (unsigned long long x = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
             x < n * es; x += stride) {
            const unsigned long long e = x / es, j = x % es;
            const unsigned char* col = s + e / 8;
            const unsigned int sh = (unsigned int)(e % 8);
            unsigned int byte = 0;
            for (unsigned int t = 0; t < 8; t++) {
                byte |= ((col[(8 * j + t) * nrow] >> sh) & 1u) << t;
            }
            d[x] = (unsigned char)byte;
        }
        return;
    }
    const unsigned long long es = p.es, n = p.len / es;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        for (unsigned long long j = 0; j < es; j++) {
            d[i * es + j] = s[j * n + i];
        }
    }
    if (blockIdx.x == 0) {
        for (unsigned long long r = n * es + threadIdx.x; r < p.len; r += blockDim.x) {
            d[r] = s[r];
        }
    }
}
