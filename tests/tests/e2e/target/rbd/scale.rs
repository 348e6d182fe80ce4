//! Many RBD namespaces on one gateway: their images' lives run on a few
//! threads whose number does not grow with them (`base::lanes`).

use super::*;
use rdmablk_tests::thread_count;

/// A target exporting `images` as namespaces 1.. of [`NQN`].
fn target_of(images: &[Image]) -> Target {
    let mut toml = format!(
        "[pollers]\ncount = 1\n\n[[listener]]\ntransport = \"tcp\"\naddress = \"127.0.0.1:{{port}}\"\n\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n"
    );
    for (i, img) in images.iter().enumerate() {
        toml += &format!(
            "\n  [[subsystem.namespace]]\n  nsid = {}\n  backend = \"rbd\"\n  pool = \"rbd\"\n  \
             image = \"{}\"\n  ceph_conf = \"{}\"\n  client_id = \"rdmablk\"\n",
            i + 1,
            img.name,
            ceph_conf().display()
        );
    }
    Target::start_config(&toml)
}

/// Threads of a target serving `images`, once every namespace is active.
fn threads_serving(images: &[Image]) -> usize {
    let t = target_of(images);
    let start = Instant::now();
    while t.log().matches("namespace active").count() < images.len() {
        assert!(
            start.elapsed() < OPEN_WITHIN,
            "{} of {} images open\n{}",
            t.log().matches("namespace active").count(),
            images.len(),
            t.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // What starts with the first image has started.
    std::thread::sleep(Duration::from_millis(500));
    let n = thread_count(t.pid());
    let mut c = controller(&t, HOST_A);
    assert_eq!(
        active(&c),
        (1..=images.len() as u32).collect::<Vec<_>>(),
        "every namespace active"
    );
    let data = Rng::new(images.len() as u64).bytes(4096);
    let q = io(&mut c);
    q.write(images.len() as u32, 0, &data, 512, false)
        .or_panic("a write to the last namespace");
    assert!(
        q.read(images.len() as u32, 0, 8, 512).or_panic("its read") == data,
        "the last namespace reads back what was written"
    );
    stop(t);
    n
}

/// A target with 32 RBD namespaces runs as many threads as one with 2
/// (there was one per namespace for its image's life).
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn threads_do_not_grow_with_rbd_namespaces() {
    let _machine = crate::alone();
    let images: Vec<Image> = std::thread::scope(|s| {
        let made: Vec<_> = (0..32)
            .map(|i| s.spawn(move || Image::create(&format!("scale-{i}"), 16 * MIB)))
            .collect();
        made.into_iter()
            .map(|m| m.join().expect("rbd create"))
            .collect()
    });
    let few = threads_serving(&images[..2]);
    let many = threads_serving(&images);
    println!("threads: {few} serving 2 RBD namespaces, {many} serving 32");
    assert_eq!(
        many, few,
        "threads serving 32 RBD namespaces against 2: they grow with the namespaces"
    );
}
