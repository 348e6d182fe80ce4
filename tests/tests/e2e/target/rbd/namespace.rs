//! A namespace follows its image: appears when it opens, follows resizes;
//! read-only namespaces with read-only credentials.

use super::*;

/// A namespace whose image does not exist yet is inactive (absent from the
/// active list, I/O refused as Invalid Namespace); once the image is
/// created it opens and the host hears Namespace Attribute Changed; a
/// resize is announced the same way, with the new size in Identify.
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn the_namespace_appears_when_its_image_opens_and_follows_resizes() {
    let _machine = crate::alone();
    let name = format!("late-{}", std::process::id());
    let spec = format!("rbd/{name}");
    let _ = rbd(&["rm", &spec]);
    // Removes the image after the target is gone (declared first).
    let img = Image { name: name.clone() };
    let t = target(&name, "", "20s");
    // A KATO longer than the waits for an event, which hold the admin queue.
    let opts = Opts {
        kato_ms: 120_000,
        ..Opts::default()
    };
    let mut c = open(&t, NQN, HOST_A, &opts);
    assert_eq!(active(&c), Vec::<u32>::new(), "no active namespace yet");
    let refused = io(&mut c)
        .exec(Queue::rw_sqe(nvm::READ, 1, 0, 1), None, 512)
        .or_panic("a read before the image exists");
    assert_status(
        &refused,
        Status::INVALID_NAMESPACE,
        "read of an inactive namespace",
    );
    // The target says why the namespace is inactive.
    wait_log(&t, "cannot open the RBD image");

    c.admin()
        .set_features(feature::ASYNC_EVENT, 1 << 8)
        .or_panic("enabling Namespace Attribute Changed");
    let wait_event = |c: &mut Controller, what: &str| {
        let aer = c
            .admin()
            .submit(Sqe::new(admin::ASYNC_EVENT, 0), None, 0)
            .or_panic("submitting an AER");
        c.admin().set_timeout(OPEN_WITHIN).or_panic("admin timeout");
        let done = c.admin().wait(aer).or_panic(what);
        assert_status(&done, Status::SUCCESS, what);
        assert_eq!(done.cqe.dw0, NS_ATTR_CHANGED, "{what}: the event");
        // Reading the Changed Namespace List (RAE clear) unmasks the event.
        let log = c
            .admin()
            .get_log(rdmablk_common::nvme::log::lid::CHANGED_NS, 4096, 0)
            .or_panic("Changed Namespace List");
        assert_eq!(
            &log[..8],
            &[1, 0, 0, 0, 0, 0, 0, 0],
            "{what}: nsid 1 changed"
        );
    };
    rbd(&[
        "create",
        &spec,
        "--size",
        "32M",
        "--image-feature",
        "layering",
    ])
    .assert_success("rbd create");
    wait_event(&mut c, "the event of the image opening");
    assert_eq!(
        t.log().matches("connected to the Ceph cluster").count(),
        1,
        "one connection while the image did not exist\n{}",
        t.log_tail()
    );
    assert_eq!(active(&c), vec![1], "active once open");
    assert_eq!(
        identify_ns(&c).nsze,
        32 * MIB / 512,
        "size of the open image"
    );
    let data = Rng::new(3).bytes(4096);
    io(&mut c).write(1, 8, &data, 512, false).or_panic("write");

    rbd(&["resize", &img.spec(), "--size", "48M"]).assert_success("rbd resize");
    wait_event(&mut c, "the event of the resize");
    assert_eq!(
        identify_ns(&c).nsze,
        48 * MIB / 512,
        "size after the resize"
    );
    let end = 48 * MIB / 512 - 8;
    io(&mut c)
        .write(1, end, &data, 512, false)
        .or_panic("write past the old end");
    let back = io(&mut c).read(1, 8, 8, 512).or_panic("read");
    assert_same(&back, &data, "data before the resize");
    drop(c);
    stop(t);
}

/// A read-only namespace opens its image for reading only, so a client
/// with read-only credentials (client.reader: `profile rbd-read-only`)
/// serves it: reads return what `rbd import` put there, writes are refused
/// with Namespace Is Write Protected, and Identify says so (NSATTR bit 0).
#[test]
#[ignore = "needs a Ceph cluster: scripts/ceph-dev.sh up, RDMABLK_CEPH_CONF"]
fn read_only_namespaces_serve_read_only_credentials() {
    let _machine = crate::alone();
    let img = Image {
        name: format!("golden-{}", std::process::id()),
    };
    let dir = TempDir::new("rbd-import");
    let file = dir.join("golden");
    let data = Rng::new(21).bytes(4 << 20);
    std::fs::write(&file, &data).or_panic("writing the image file");
    let _ = rbd(&["rm", &img.spec()]);
    rbd(&[
        "import",
        "--image-feature",
        "layering",
        file.to_str().expect("path"),
        &img.spec(),
    ])
    .assert_success("rbd import");
    let t = target_as(
        &img.name,
        "",
        "20s",
        "client_id = \"reader\"\n  read_only = true",
    );
    wait_active(&t);
    let mut c = controller(&t, HOST_A);
    assert_eq!(identify_ns(&c).nsattr & 1, 1, "NSATTR: write protected");
    // In 1 MiB reads (the target's MDTS).
    for (k, chunk) in data.chunks(MIB as usize).enumerate() {
        let slba = k as u64 * 2048;
        let back = io(&mut c).read(1, slba, 2048, 512).or_panic("read");
        assert_same(&back, chunk, &format!("the imported bytes at LBA {slba}"));
    }
    let refused = io(&mut c)
        .exec(Queue::rw_sqe(nvm::WRITE, 1, 0, 8), Some(&data[..4096]), 0)
        .or_panic("a write");
    assert_status(
        &refused,
        Status::NAMESPACE_WRITE_PROTECTED,
        "write to a read-only namespace",
    );
    drop(c);
    stop(t);
}
