//! Memory of a pass over many files through the read view, in process (the core
//! without FUSE): docs/architecture.md, "Memory bound".
//!
//!     cargo run --release --features static-hdf5 --example mem_pass -- DIR [FILES]
//!
//! Makes DIR's files when it has none (FILES files, 30 by default, of 300 chunked gzip
//! datasets with 5 attributes each), then looks up every dataset of every file and
//! reads its `meta.json` (and its `data` with `READ_DATA=1`), forgetting the inodes as
//! the kernel would. Prints malloc's bytes in use after each file, and the growth per
//! file once the dataset-model bound holds (between the first and the last time the
//! bound dropped models, so the models held are the same at both ends).
use h5tilefs::fs::{Caller, Fs, FsOptions, ROOT_INO};
use std::path::Path;

fn in_use() -> usize {
    // SAFETY: a plain query of malloc's statistics.
    let m = unsafe { libc::mallinfo2() };
    // bytes in use, mmap-ed blocks included
    m.uordblks + m.hblkhd
}

fn read_ino(fs: &Fs, ino: u64) -> u64 {
    let (fh, _, _) = fs.open(ino, false, &Caller::DAEMON).expect("open");
    let mut n = 0u64;
    loop {
        let b = fs.read(fh, n, 1 << 16).expect("read");
        if b.is_empty() {
            break;
        }
        n += b.len() as u64;
    }
    fs.release(fh);
    n
}

fn make_files(dir: &Path, n: usize) {
    let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    for i in 0..n {
        let f = hdf5::File::create(dir.join(format!("f{i:03}.h5"))).expect("create");
        for d in 0..300 {
            let ds = f
                .new_dataset::<f32>()
                .shape([1000])
                .chunk([100])
                .deflate(4)
                .create(format!("d{d:03}").as_str())
                .expect("dataset");
            ds.write_raw(&data).expect("write");
            for a in 0..5 {
                ds.new_attr::<f64>()
                    .create(format!("a{a}").as_str())
                    .expect("attr")
                    .write_scalar(&(a as f64 * 1.5))
                    .expect("attr write");
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1).map(Path::new) else {
        eprintln!("usage: mem_pass DIR [FILES]");
        std::process::exit(2);
    };
    let nfiles: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let read_data = std::env::var("READ_DATA").is_ok();
    std::fs::create_dir_all(dir).expect("mkdir");
    let listed = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("read_dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".h5"))
            .collect();
        v.sort();
        v
    };
    if listed(dir).is_empty() {
        let t = std::time::Instant::now();
        make_files(dir, nfiles);
        println!("made {nfiles} files in {:.1} s", t.elapsed().as_secs_f64());
    }
    let names = listed(dir);
    let fs = Fs::new(
        dir,
        FsOptions {
            gpu: h5tilefs::gpu::GpuMode::Off,
            cache_bytes: 64 << 20,
            ..FsOptions::default()
        },
    )
    .expect("core");
    let models = |fs: &Fs| -> u64 {
        let st: serde_json::Value = serde_json::from_slice(&fs.control_json()).unwrap_or_default();
        st["stats"]["dataset_models"].as_u64().unwrap_or(0)
    };
    let base = in_use();
    let mut prev = base;
    let mut prev_models = 0;
    let mut sheds: Vec<(usize, usize)> = Vec::new();
    let t = std::time::Instant::now();
    for (i, name) in names.iter().take(nfiles).enumerate() {
        let f = fs.lookup(ROOT_INO, name).expect("lookup file").ino;
        let mut looked = vec![f];
        for e in fs.readdir(f).expect("readdir") {
            if e.kind != h5tilefs::fs::Kind::Dir {
                continue;
            }
            let d = fs.lookup(f, &e.name).expect("lookup dataset").ino;
            let m = fs.lookup(d, "meta.json").expect("lookup meta.json").ino;
            read_ino(&fs, m);
            looked.extend([d, m]);
            if read_data {
                let x = fs.lookup(d, "data").expect("lookup data").ino;
                read_ino(&fs, x);
                looked.push(x);
            }
        }
        for ino in looked {
            fs.forget(ino, 1);
        }
        let now = in_use();
        let held = models(&fs);
        println!(
            "file {i:3}: {:7.1} MB in use ({:+6.2} MB), {held} models",
            (now - base) as f64 / 1e6,
            (now as f64 - prev as f64) / 1e6,
        );
        if held < prev_models {
            sheds.push((i, now));
        }
        prev = now;
        prev_models = held;
    }
    println!("pass: {:.1} s", t.elapsed().as_secs_f64());
    if let (Some(a), Some(b)) = (sheds.first(), sheds.last()) {
        if b.0 > a.0 {
            println!(
                "growth per file once the model bound holds: {:.2} MB (files {} to {})",
                (b.1 as f64 - a.1 as f64) / 1e6 / (b.0 - a.0) as f64,
                a.0,
                b.0
            );
        }
    }
}
