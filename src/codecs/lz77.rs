//! Byte-oriented LZ77 formats: LZF (liblzf) and BloscLZ.

use super::{corrupt, too_large, Failure, Out};

#[inline]
pub(super) fn copy_match(out: &mut Vec<u8>, dist: usize, len: usize) {
    let start = out.len() - dist;
    if dist >= len {
        out.extend_from_within(start..start + len);
    } else if dist == 1 {
        let b = out[start];
        out.resize(out.len() + len, b);
    } else {
        for i in 0..len {
            let b = out[start + i];
            out.push(b);
        }
    }
}

/// liblzf's format, as h5py's LZF filter writes it (the raw stream, no header).
pub fn lzf(input: &[u8], cap: usize) -> Out {
    let mut out: Vec<u8> = Vec::with_capacity(cap);
    let mut ip = 0usize;
    let n = input.len();
    while ip < n {
        let ctrl = input[ip] as usize;
        ip += 1;
        if ctrl < 32 {
            let len = ctrl + 1;
            if out.len() + len > cap {
                return too_large("LZF", (out.len() + len) as u64, cap);
            }
            let Some(lit) = input.get(ip..ip + len) else {
                return corrupt("LZF literal run past the end of the stored chunk");
            };
            out.extend_from_slice(lit);
            ip += len;
        } else {
            let mut len = ctrl >> 5;
            let mut dist = ((ctrl & 0x1f) << 8) + 1;
            if len == 7 {
                let Some(&b) = input.get(ip) else {
                    return corrupt("LZF match length past the end of the stored chunk");
                };
                len += b as usize;
                ip += 1;
            }
            let Some(&b) = input.get(ip) else {
                return corrupt("LZF match offset past the end of the stored chunk");
            };
            ip += 1;
            dist += b as usize;
            len += 2;
            if out.len() + len > cap {
                return too_large("LZF", (out.len() + len) as u64, cap);
            }
            if dist > out.len() {
                return corrupt("LZF match before the start of the chunk");
            }
            copy_match(&mut out, dist, len);
        }
    }
    Ok(out)
}

/// BloscLZ (c-blosc's blosclz_decompress): decodes exactly `want` bytes or fails.
pub(super) fn blosclz(input: &[u8], want: usize, out: &mut Vec<u8>) -> Result<(), Failure> {
    const MAX_DISTANCE: usize = 8191;
    let bad = || corrupt("BloscLZ stream is corrupt");
    let base = out.len();
    let limit = base + want;
    let n = input.len();
    if n == 0 {
        return bad();
    }
    let mut ip = 1usize;
    let mut ctrl = (input[0] & 31) as usize;
    loop {
        if ctrl >= 32 {
            let mut len = (ctrl >> 5) - 1;
            let mut ofs = (ctrl & 31) << 8;
            if len == 6 {
                loop {
                    if ip + 1 >= n {
                        return bad();
                    }
                    let code = input[ip] as usize;
                    ip += 1;
                    len += code;
                    if code != 255 {
                        break;
                    }
                }
            } else if ip + 1 >= n {
                return bad();
            }
            let code = input[ip] as usize;
            ip += 1;
            len += 3;
            // Distance back from the current end, before the final -1 of the C code.
            let mut back = ofs + code;
            if code == 255 && ofs == (31 << 8) {
                if ip + 1 >= n {
                    return bad();
                }
                ofs = ((input[ip] as usize) << 8) + input[ip + 1] as usize;
                ip += 2;
                back = ofs + MAX_DISTANCE;
            }
            if out.len() + len > limit {
                return bad();
            }
            // `ref - 1 < output` in the C code: the copy source starts `back + 1` back.
            if back + 1 > out.len() - base {
                return bad();
            }
            if ip >= n {
                break;
            }
            ctrl = input[ip] as usize;
            ip += 1;
            copy_match(out, back + 1, len);
        } else {
            let len = ctrl + 1;
            if out.len() + len > limit || ip + len > n {
                return bad();
            }
            out.extend_from_slice(&input[ip..ip + len]);
            ip += len;
            if ip >= n {
                break;
            }
            ctrl = input[ip] as usize;
            ip += 1;
        }
    }
    if out.len() != limit {
        return bad();
    }
    Ok(())
}
