use super::*;

/// FNV-1a: a hash that every daemon computes the same way.
pub(super) fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A file-name-safe, collision-free encoding of an HDF5 path.
pub fn encode(h5path: &str) -> String {
    let clean: String = h5path
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    format!("{clean}-{:016x}", fnv(h5path))
}

/// A new tile-source generation name (unique across daemons and time).
pub(super) fn new_gen(writer_id: &str) -> String {
    format!(
        "g{:x}",
        fnv(&format!(
            "{writer_id}{:?}{}",
            std::time::SystemTime::now(),
            unique()
        ))
    )
}

impl Pending {
    pub(super) fn split(file_rel: &Path) -> Result<(PathBuf, String)> {
        let name = file_rel
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::invalid("bad file name"))?
            .to_string();
        let parent = file_rel.parent().unwrap_or(Path::new("")).to_path_buf();
        Ok((parent, name))
    }

    pub fn stage_dir(&self, file_rel: &Path) -> Result<PathBuf> {
        let (parent, name) = Self::split(file_rel)?;
        Ok(self.root.join(parent).join(STAGE_DIR).join(name))
    }

    /// `<stem>_h5tilefs_vds`, relative to the file's directory.
    pub fn sources_rel(file_rel: &Path) -> Result<String> {
        let (_, name) = Self::split(file_rel)?;
        let stem = name
            .strip_suffix(".h5")
            .or_else(|| name.strip_suffix(".hdf5"))
            .unwrap_or(&name);
        Ok(format!("{stem}{}", crate::ondisk::SOURCES_SUFFIX))
    }

    pub(super) fn node_dir(&self, file_rel: &Path, h5path: &str) -> Result<PathBuf> {
        Ok(self
            .stage_dir(file_rel)?
            .join(crate::ondisk::NODES_DIR)
            .join(encode(h5path)))
    }

    pub(super) fn sources_dir(&self, file_rel: &Path, h5path: &str, gen: &str) -> Result<PathBuf> {
        let (parent, _) = Self::split(file_rel)?;
        Ok(self
            .root
            .join(parent)
            .join(Self::sources_rel(file_rel)?)
            .join(encode(h5path))
            .join(gen))
    }
}
