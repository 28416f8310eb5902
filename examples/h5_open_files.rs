//! libhdf5 alone (no h5tilefs code): what an open file holds after each of its datasets
//! was opened, its attributes read, and closed again; the files of `mem_pass`.
//!
//!     cargo run --release --features static-hdf5 --example h5_open_files -- DIR [FILES]
//!
//! Each file is opened with the daemon's cache settings and kept open. Prints malloc's
//! bytes in use per file and the metadata cache's size as libhdf5 counts it.
//! `NO_DATASETS=1`: open the files only; `EVICT=1`: empty each file's metadata cache
//! after its datasets were read (as `h5::evict_metadata` does).
use std::path::Path;

fn in_use() -> usize {
    // SAFETY: a plain query of malloc's statistics.
    let m = unsafe { libc::mallinfo2() };
    // bytes in use, mmap-ed blocks included
    m.uordblks + m.hblkhd
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(&args[1]);
    let nfiles: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(30);
    let touch = std::env::var("NO_DATASETS").is_err();
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let mut held = Vec::new();
    let base = in_use();
    let mut prev = base;
    for (i, p) in names.iter().take(nfiles).enumerate() {
        let mut b = hdf5::File::with_options();
        let mdc = hdf5::plist::file_access::MetadataCacheConfig {
            set_initial_size: true,
            initial_size: 256 << 10,
            min_size: 128 << 10,
            max_size: 1 << 20,
            ..Default::default()
        };
        b.with_fapl(|p| p.mdc_config(&mdc).chunk_cache(521, 0, 0.75));
        let f = b.open(p).unwrap();
        if touch {
            for n in f.member_names().unwrap() {
                let d = f.dataset(&n).unwrap();
                for a in d.attr_names().unwrap() {
                    let _: f64 = d.attr(&a).unwrap().read_scalar().unwrap();
                }
                let _ = d.dcpl().unwrap();
            }
        }
        if std::env::var("EVICT").is_ok() {
            evict(f.id());
        }
        let (mut max, mut minc, mut cur, mut ents) = (0usize, 0usize, 0usize, 0i32);
        // SAFETY: a plain query on an open file id.
        unsafe {
            hdf5_sys::h5f::H5Fget_mdc_size(f.id(), &mut max, &mut minc, &mut cur, &mut ents);
        }
        // SAFETY: a plain query on an open file id.
        let open = unsafe { hdf5_sys::h5f::H5Fget_obj_count(f.id(), hdf5_sys::h5f::H5F_OBJ_ALL) };
        held.push(f);
        let now = in_use();
        println!(
            "file {i:3} in_use {:8.1} MB  +{:5.2} MB  mdc max {} cur {} entries {} open objects {}",
            (now - base) as f64 / 1e6,
            (now as f64 - prev as f64) / 1e6,
            max,
            cur,
            ents,
            open
        );
        prev = now;
    }
    drop(held);
    println!(
        "all closed: in_use {:8.1} MB",
        (in_use() as f64 - base as f64) / 1e6
    );
}

/// Empties the file's metadata cache down to what open objects pin: shrink its size,
/// touch the root group's header (the cache makes room on its next access), restore.
fn evict(fid: hdf5_sys::h5i::hid_t) {
    use hdf5_sys::h5ac::H5AC_cache_config_t;
    // SAFETY: plain calls on an open file id with a config struct we own.
    unsafe {
        let mut cfg: H5AC_cache_config_t = std::mem::zeroed();
        cfg.version = hdf5_sys::h5ac::H5AC__CURR_CACHE_CONFIG_VERSION;
        assert!(hdf5_sys::h5f::H5Fget_mdc_config(fid, &mut cfg) >= 0);
        let mut small = cfg;
        small.set_initial_size = 1;
        small.initial_size = 1024;
        small.min_size = 1024;
        assert!(hdf5_sys::h5f::H5Fset_mdc_config(fid, &small) >= 0);
        let mut info: hdf5_sys::h5o::H5O_info2_t = std::mem::zeroed();
        hdf5_sys::h5o::H5Oget_info3(fid, &mut info, hdf5_sys::h5o::H5O_INFO_BASIC);
        let mut back = cfg;
        back.set_initial_size = 1;
        back.initial_size = 256 << 10;
        assert!(hdf5_sys::h5f::H5Fset_mdc_config(fid, &back) >= 0);
    }
}
