//! Links libaec (SZIP decoding, src/codecs/c.rs) statically when its static libraries are
//! installed: the daemon must run on machines without it (a static binary is copied to
//! the GPU machines).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LIBAEC_LIB_DIR");
    let dirs: Vec<std::path::PathBuf> = std::env::var_os("LIBAEC_LIB_DIR")
        .map(|d| vec![d.into()])
        .unwrap_or_else(|| {
            [
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
                "/usr/local/lib",
            ]
            .iter()
            .map(Into::into)
            .collect()
        });
    println!("cargo::rustc-check-cfg=cfg(h5tilefs_szip)");
    let Some(dir) = dirs
        .iter()
        .find(|d| d.join("libsz.a").is_file() && d.join("libaec.a").is_file())
    else {
        // A build without it still works (a `pip install .` on a machine without the
        // package): SZIP chunks are then read through libhdf5's plugins, and meta.json
        // says so (decoder "none" or "plugin").
        println!(
            "cargo:warning=libaec's static libraries (libsz.a, libaec.a) were not found in \
             {dirs:?}: building without the built-in SZIP decoder. Install libaec-dev \
             (`apt-get install libaec-dev`, which `make setup` does) or set LIBAEC_LIB_DIR \
             to have it."
        );
        return;
    };
    println!("cargo:rustc-cfg=h5tilefs_szip");
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=static=sz");
    println!("cargo:rustc-link-lib=static=aec");
}
