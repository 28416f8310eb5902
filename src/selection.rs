//! Hyperslab selections and the parser for `slice/` names (NumPy basic slicing).

use crate::error::{Error, Result};

/// One dimension of a hyperslab: `count` elements at `start`, `start + step`, ...
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimSel {
    pub start: u64,
    pub count: u64,
    pub step: u64,
}

/// A regular selection over a dataset, one [`DimSel`] per dimension.
/// Its bytes are laid out in C order of the selected elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hyperslab {
    pub dims: Vec<DimSel>,
}

impl Hyperslab {
    /// The whole dataset.
    pub fn full(shape: &[u64]) -> Self {
        Hyperslab {
            dims: shape
                .iter()
                .map(|&n| DimSel {
                    start: 0,
                    count: n,
                    step: 1,
                })
                .collect(),
        }
    }

    /// A contiguous block `start .. start + count` (step 1 everywhere).
    pub fn block(start: &[u64], count: &[u64]) -> Self {
        Hyperslab {
            dims: start
                .iter()
                .zip(count)
                .map(|(&s, &c)| DimSel {
                    start: s,
                    count: c,
                    step: 1,
                })
                .collect(),
        }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of selected elements (saturating; shapes are validated elsewhere).
    pub fn num_elements(&self) -> u64 {
        self.dims
            .iter()
            .fold(1u64, |acc, d| acc.saturating_mul(d.count))
    }

    pub fn counts(&self) -> Vec<u64> {
        self.dims.iter().map(|d| d.count).collect()
    }
}

/// Parses one item of a slice name into a selection on a dimension of length `len`.
fn parse_item(item: &str, len: u64, dim: usize) -> Result<DimSel> {
    let item = item.trim();
    let bad = |why: &str| Error::not_found(format!("dimension {dim}: {why} in {item:?}"));
    let parse_int = |s: &str| -> Result<Option<i128>> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        let digits = s.strip_prefix('-').unwrap_or(s);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 20 {
            return Err(bad("not an integer"));
        }
        s.parse::<i128>()
            .map(Some)
            .map_err(|_| bad("not an integer"))
    };
    let len_i = len as i128;
    if !item.contains(':') {
        let Some(i) = parse_int(item)? else {
            return Err(bad("empty item"));
        };
        let idx = if i < 0 { i + len_i } else { i };
        if idx < 0 || idx >= len_i {
            return Err(bad(&format!("index out of range for length {len}")));
        }
        return Ok(DimSel {
            start: idx as u64,
            count: 1,
            step: 1,
        });
    }
    let parts: Vec<&str> = item.split(':').collect();
    if parts.len() > 3 {
        return Err(bad("too many ':'"));
    }
    let start = parse_int(parts[0])?;
    let stop = parse_int(parts[1])?;
    let step = if parts.len() == 3 {
        parse_int(parts[2])?
    } else {
        None
    };
    let step = step.unwrap_or(1);
    if step <= 0 {
        return Err(bad("step must be positive"));
    }
    // NumPy's slice.indices() for a positive step: clip into [0, len].
    let clip = |v: Option<i128>, default: i128| -> i128 {
        match v {
            None => default,
            Some(v) if v < 0 => (v + len_i).max(0),
            Some(v) => v.min(len_i),
        }
    };
    let start = clip(start, 0);
    let stop = clip(stop, len_i);
    let count = if stop > start {
        (stop - start + step - 1) / step
    } else {
        0
    };
    Ok(DimSel {
        start: if count == 0 { 0 } else { start as u64 },
        count: count as u64,
        // A step above the length selects at most one element; clamping keeps it
        // equivalent and inside u64 (a 20-digit step of 2^64 would wrap to 0).
        step: step.min(len_i.max(1)) as u64,
    })
}

/// Parses a `slice/` file name against a dataset shape.
///
/// Items are comma separated, one per leading dimension; omitted trailing
/// dimensions are taken whole. A scalar dataset accepts only `()`.
pub fn parse_slice(name: &str, shape: &[u64]) -> Result<Hyperslab> {
    let name = name.trim();
    if name == "()" {
        if shape.is_empty() {
            return Ok(Hyperslab { dims: vec![] });
        }
        return Ok(Hyperslab::full(shape));
    }
    if name.is_empty() {
        return Err(Error::not_found("empty selection name"));
    }
    if shape.is_empty() {
        return Err(Error::not_found(format!(
            "scalar dataset: the only selection is '()', got {name:?}"
        )));
    }
    let items: Vec<&str> = name.split(',').collect();
    // A trailing comma (as in `5,`) is allowed, like in Python.
    let items: Vec<&str> = if items.len() > 1 && items.last().is_some_and(|s| s.trim().is_empty()) {
        items[..items.len() - 1].to_vec()
    } else {
        items
    };
    if items.len() > shape.len() {
        return Err(Error::not_found(format!(
            "{} items for a dataset of rank {}",
            items.len(),
            shape.len()
        )));
    }
    let mut dims = Vec::with_capacity(shape.len());
    for (d, &len) in shape.iter().enumerate() {
        match items.get(d) {
            Some(item) => dims.push(parse_item(item, len, d)?),
            None => dims.push(DimSel {
                start: 0,
                count: len,
                step: 1,
            }),
        }
    }
    Ok(Hyperslab { dims })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sel(name: &str, shape: &[u64]) -> Vec<(u64, u64, u64)> {
        parse_slice(name, shape)
            .unwrap()
            .dims
            .iter()
            .map(|d| (d.start, d.count, d.step))
            .collect()
    }

    #[test]
    fn basic_forms() {
        assert_eq!(
            sel("100:200,::2", &[4096, 10]),
            vec![(100, 100, 1), (0, 5, 2)]
        );
        assert_eq!(sel("3", &[10, 4]), vec![(3, 1, 1), (0, 4, 1)]);
        assert_eq!(sel("-1", &[10]), vec![(9, 1, 1)]);
        assert_eq!(sel(":", &[7]), vec![(0, 7, 1)]);
        assert_eq!(sel("-3:", &[10]), vec![(7, 3, 1)]);
        assert_eq!(sel(":-3", &[10]), vec![(0, 7, 1)]);
        assert_eq!(sel("0:1000", &[100]), vec![(0, 100, 1)]);
        assert_eq!(sel("5:2", &[10]), vec![(0, 0, 1)]);
        assert_eq!(sel("1:10:3", &[10]), vec![(1, 3, 3)]);
        assert_eq!(sel(" 1 : 4 ", &[10]), vec![(1, 3, 1)]);
        assert_eq!(sel("2,", &[10, 3]), vec![(2, 1, 1), (0, 3, 1)]);
        assert_eq!(sel("()", &[]), vec![]);
    }

    #[test]
    fn rejects_bad_names() {
        for bad in [
            "1:2:0", "abc", "1,2,3", "99999", "-11", "1::-1", "", "1:2:3:4", "+1", "1.5", ",",
        ] {
            let e = parse_slice(bad, &[10, 10]).unwrap_err();
            assert_eq!(e.errno, libc::ENOENT, "{bad}");
        }
        assert!(parse_slice("0", &[]).is_err());
    }

    /// Reference model: Python's slice.indices() for positive steps.
    fn model(start: Option<i64>, stop: Option<i64>, step: i64, len: i64) -> Vec<i64> {
        let norm = |v: i64| if v < 0 { (v + len).max(0) } else { v.min(len) };
        let s = start.map(norm).unwrap_or(0);
        let e = stop.map(norm).unwrap_or(len);
        (s..e).step_by(step as usize).collect()
    }

    proptest! {
        #[test]
        fn matches_python_slicing(len in 0i64..50, start in proptest::option::of(-60i64..60),
                                  stop in proptest::option::of(-60i64..60), step in 1i64..7) {
            let fmt = |v: Option<i64>| v.map(|x| x.to_string()).unwrap_or_default();
            let name = format!("{}:{}:{}", fmt(start), fmt(stop), step);
            let d = &parse_slice(&name, &[len as u64]).unwrap().dims[0];
            let got: Vec<i64> = (0..d.count).map(|i| (d.start + i * d.step) as i64).collect();
            prop_assert_eq!(got, model(start, stop, step, len));
        }

        #[test]
        fn index_in_range(len in 1i64..50, i in -60i64..60) {
            let r = parse_slice(&i.to_string(), &[len as u64]);
            if i >= -len && i < len {
                let d = &r.unwrap().dims[0];
                prop_assert_eq!(d.start as i64, if i < 0 { i + len } else { i });
                prop_assert_eq!(d.count, 1);
            } else {
                prop_assert!(r.is_err());
            }
        }
    }
}
