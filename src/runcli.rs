//! `h5tilefs run -- CMD ARGS…`: CMD with the interception library preloaded
//! (src/preload, docs/direct.md).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const LIB: &str = "libh5tilefs_preload.so";

/// Where the library may be, in order: `$H5TILEFS_PRELOAD`; beside this binary (a cargo
/// build, `make install`); `../lib/h5tilefs/` of it; the Python package of the
/// environment this binary was installed into by pip (`bin/../lib/python3.*/
/// site-packages/h5tilefs/`).
fn candidates(exe: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("H5TILEFS_PRELOAD") {
        out.push(PathBuf::from(p));
        return out;
    }
    let Some(dir) = exe.parent() else {
        return out;
    };
    out.push(dir.join(LIB));
    if let Some(prefix) = dir.parent() {
        out.push(prefix.join("lib/h5tilefs").join(LIB));
        if let Ok(rd) = std::fs::read_dir(prefix.join("lib")) {
            let mut pys: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("python3"))
                })
                .collect();
            pys.sort();
            for py in pys {
                // pip names an extension module with the interpreter's suffix.
                let pkg = py.join("site-packages/h5tilefs");
                out.push(pkg.join(LIB));
                if let Ok(rd) = std::fs::read_dir(&pkg) {
                    let mut libs: Vec<PathBuf> = rd
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| {
                            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                                n.starts_with("libh5tilefs_preload") && n.ends_with(".so")
                            })
                        })
                        .collect();
                    libs.sort();
                    out.extend(libs);
                }
            }
        }
    }
    out
}

pub fn run_direct(cmd: &[OsString]) -> ExitCode {
    let Some((prog, args)) = cmd.split_first() else {
        eprintln!("h5tilefs run: no command given (h5tilefs run -- CMD ARGS...)");
        return ExitCode::from(2);
    };
    let mut c = std::process::Command::new(prog);
    c.args(args);
    if std::env::var_os("H5TILEFS_DIRECT").is_some_and(|v| v == "0") {
        let e = c.exec();
        eprintln!("h5tilefs run: cannot run {}: {e}", prog.to_string_lossy());
        return ExitCode::from(127);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let tried = candidates(&exe);
    let Some(lib) = tried.iter().find(|p| p.is_file()) else {
        eprintln!(
            "h5tilefs run: the interception library {LIB} was not found (looked at {}); \
             build it with `make build` or set H5TILEFS_PRELOAD to its path",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return ExitCode::from(1);
    };
    let lib = lib.canonicalize().unwrap_or_else(|_| lib.clone());
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    c.env("LD_PRELOAD", preload);
    let e = c.exec();
    eprintln!("h5tilefs run: cannot run {}: {e}", prog.to_string_lossy());
    ExitCode::from(127)
}
