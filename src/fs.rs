//! The filesystem core, fuser-free (`fuse.rs` adapts it); every operation returns
//! `Result`. Layers, top down (each module uses only those below it):
//!
//! - `vfs`: `Fs`, what the adapter calls; dispatches to views and open files. The
//!   write path (`write`, `zarr_write`) and the GPU ioctls (`gpu`) add requests to it.
//! - `open`: open files (`OpenFile`), how one is opened and read.
//! - `views`, `zarr_view`: what each kind of directory shows (lookup, attributes,
//!   listing) against the mount's context.
//! - `pending_io`: the read path of pending datasets; `listing`: held listings;
//!   `buffers`: GPU buffer registrations.
//! - `mount`: the context (`Mount`): namespace, pending state, inodes, options, cache,
//!   and what a node's path is now (`Mount::resolve`).
//! - `inodes`, `node`, `attr`, `access`: the inode table, the nodes, attributes, callers.
//!
//! Name rules (reserved names, escapes, grammars, the dataset directory's entries) are
//! `crate::names`.

mod access;
mod attr;
mod buffers;
mod extents;
mod gpu;
mod inodes;
mod listing;
mod mount;
mod node;
mod open;
mod pending_io;
mod vfs;
mod views;
mod write;
mod zarr_view;
mod zarr_write;

pub use crate::names::CONTROL_NAME;
pub use access::Caller;
pub use attr::{Attr, DirEntry, FsOptions, Invalidator, Kind};
pub use buffers::{validate_read, Registration};
pub use extents::query;
pub use inodes::ROOT_INO;
pub use mount::Mount;
pub use node::Node;
pub use vfs::Fs;
