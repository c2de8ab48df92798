//! Pack files: writing the few objects of one push, and indexing what a fetch receives.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use flate2::{Compression, write::ZlibEncoder};
use gix::objs::Kind;
use sha1::{Digest, Sha1};

use super::{Corruption, Error};

/// Write a version-2 pack of undeltified objects (a state push carries a handful of them).
pub fn write(objects: &[(Kind, Vec<u8>)]) -> Result<Vec<u8>, Error> {
    let mut pack = Vec::new();
    pack.extend_from_slice(b"PACK");
    pack.extend_from_slice(&2u32.to_be_bytes());
    let count = u32::try_from(objects.len()).map_err(|_| Error::TooManyObjects)?;
    pack.extend_from_slice(&count.to_be_bytes());
    for (kind, data) in objects {
        let code: u8 = match kind {
            Kind::Commit => 1,
            Kind::Tree => 2,
            Kind::Blob => 3,
            Kind::Tag => 4,
        };
        // Header: type and size, 4 bits of size first, then 7 bits per byte, low bits first.
        let mut size = data.len();
        let mut byte = (code << 4) | (size & 0x0f) as u8;
        size >>= 4;
        while size > 0 {
            pack.push(byte | 0x80);
            byte = (size & 0x7f) as u8;
            size >>= 7;
        }
        pack.push(byte);
        let mut encoder = ZlibEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(data)?;
        pack.extend_from_slice(&encoder.finish()?);
    }
    let digest = Sha1::digest(&pack);
    pack.extend_from_slice(&digest);
    Ok(pack)
}

/// Verify and index a received pack into `objects/pack` of the repository at `git_dir`; the
/// ids of the objects it holds.
///
/// The pack and its index are written to temporary files and renamed into place, so a crash
/// leaves either nothing or a whole pack behind.
pub fn index_into(git_dir: &Path, pack: &[u8]) -> Result<Vec<gix::ObjectId>, Error> {
    let directory = git_dir.join("objects").join("pack");
    std::fs::create_dir_all(&directory)?;
    let interrupt = AtomicBool::new(false);
    let mut input = pack;
    let written = gix_pack::Bundle::write_to_directory(
        &mut input,
        Some(&directory),
        &mut gix::progress::Discard,
        &interrupt,
        None::<gix::odb::Handle>,
        gix::hash::Kind::Sha1,
        gix_pack::bundle::write::Options::default(),
    )
    .map_err(Error::Pack)?;
    let Some(index) = written.index_path else {
        return Ok(Vec::new());
    };
    let index = gix_pack::index::File::at(&index, gix::hash::Kind::Sha1)
        .map_err(|e| Error::Corrupt(Corruption::PackIndex(e.to_string())))?;
    Ok(index.iter().map(|entry| entry.oid).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_pack_indexes_and_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = gix::init_bare(dir.path()).expect("init");
        let big = vec![b'x'; 5000];
        let pack =
            write(&[(Kind::Blob, b"hello".to_vec()), (Kind::Blob, big.clone())]).expect("pack");
        let held = index_into(repo.git_dir(), &pack).expect("index");
        let repo = gix::open(dir.path()).expect("reopen");
        let id = gix::objs::compute_hash(gix::hash::Kind::Sha1, Kind::Blob, &big).expect("hash");
        assert_eq!(held.len(), 2);
        assert!(held.contains(&id));
        assert_eq!(repo.find_object(id).expect("found").data, big);
    }
}
