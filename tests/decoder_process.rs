//! The GPU decoder process (`h5tilefs gpu-decoder`, docs/gpu-decode.md) on any machine:
//! it answers damaged and out-of-range requests with a refusal instead of failing, keeps
//! serving its other connections when one closes, and exits once the daemon's side has
//! closed them all. (Its decoding is checked on the device: tests/gpu/.)

use h5tilefs::gpu::wire::{self, Copy, Item, Reply, Request};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The process, started as the daemon starts it, from a process with many descriptors
/// open (a daemon has backing files and cuFile handles open: the first version of the
/// start-up expected fixed free descriptor numbers and failed there).
fn start() -> (std::process::Child, Vec<UnixStream>) {
    let busy: Vec<std::fs::File> = (0..100)
        .map(|_| std::fs::File::open("/proc/self/exe").unwrap())
        .collect();
    let (child, socks) =
        h5tilefs::gpu::spawn_decoder_process(std::path::Path::new(env!("CARGO_BIN_EXE_h5tilefs")))
            .unwrap();
    drop(busy);
    for s in &socks {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    (child, socks)
}

fn request() -> Request {
    Request {
        device: 0,
        handle: [7; 64],
        alloc_size: 1 << 20,
        image_id: 1,
        image_len: 4096,
        used: 100,
        codec: 1,
        scratch: 1 << 20,
        retired: vec![],
        items: vec![Item {
            src: 0,
            src_len: 100,
            dst: 0,
            len: 4096,
            raw: false,
        }],
        copies: vec![Copy {
            src: 0,
            src_pitch: 4096,
            width: 4096,
            rows: 1,
            pitch: 4096,
            dst: 0,
        }],
        posts: vec![],
    }
}

fn ask(s: &mut UnixStream, body: &[u8]) -> Reply {
    wire::send(s, body, None).unwrap();
    let (b, _) = wire::recv(s).unwrap().expect("a reply");
    Reply::decode(&b).unwrap()
}

fn refused(r: Reply) -> String {
    match r {
        Reply::Failed { why, .. } => why,
        Reply::Done => panic!("a request that cannot be served was answered done"),
    }
}

#[test]
fn bad_requests_are_refused_and_the_process_ends_with_its_daemon() {
    let (mut child, mut conns) = start();
    conns.truncate(2);
    // A frame that is no request.
    let why = refused(ask(&mut conns[0], &[1, 2, 3]));
    assert!(why.contains("cut short"), "{why}");
    // Ranges outside the scratch or the client's allocation.
    let mut r = request();
    r.copies[0].dst = (1 << 20) - 100;
    let why = refused(ask(&mut conns[0], &r.encode()));
    assert!(why.contains("copy 0"), "{why}");
    // Rows of a partial edge chunk whose source pitch runs past the scratch.
    let mut r = request();
    r.copies[0].rows = 2;
    r.copies[0].pitch = 8192;
    r.copies[0].src_pitch = 1 << 20;
    let why = refused(ask(&mut conns[0], &r.encode()));
    assert!(why.contains("copy 0"), "{why}");
    let mut r = request();
    r.items[0].src_len = 5000;
    let why = refused(ask(&mut conns[1], &r.encode()));
    assert!(why.contains("item 0"), "{why}");
    // An unknown codec.
    let mut r = request();
    r.codec = 99;
    let why = refused(ask(&mut conns[1], &r.encode()));
    assert!(why.contains("codec"), "{why}");
    // An unshuffle writing outside the scratch.
    let mut r = request();
    r.posts = vec![wire::Post {
        src: 0,
        dst: (1 << 20) - 8,
        len: 4096,
        es: 4,
        want: wire::NO_CHECKSUM,
    }];
    let why = refused(ask(&mut conns[1], &r.encode()));
    assert!(why.contains("post 0"), "{why}");
    // A well-formed request this machine cannot serve (no GPU, no nvCOMP, a made-up
    // handle or no image descriptor): refused, not a crash.
    refused(ask(&mut conns[0], &request().encode()));
    // One connection closed: the other still serves.
    drop(conns.remove(0));
    refused(ask(&mut conns[0], &[0; 8]));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the process ended early"
    );
    // All closed: the process ends.
    drop(conns);
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the process outlived its daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
