//! The weights a GGUF model multiplies with `--precision ggml` are the file's own bytes, read
//! where the file is held (the map), never copied; only the forms a block product regroups
//! (`Q5_0`, `Q5_1`) hold a copy, equal to the regrouping of the file's bytes. Checked on the
//! `../shared/reference/kquants` files (one tiny Llama in every llama.cpp quantisation).

use super::gguf::{load_gguf, GgufWeights};
use super::by_gguf_architecture;
use crate::model::linear::for_each_linear;
use crate::backend::{Backend, KQuantMatrix, PackedWeight, RawBytes, CPU};
use crate::store::file_memory::FileMemory;
use crate::store::gguf::GgufFile;
use std::path::{Path, PathBuf};

/// The `../shared/reference/kquants` GGUF files, or `None` (with the reason printed).
fn kquant_files() -> Option<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/kquants");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipped: {} is absent", dir.display());
        return None;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    Some(files)
}

/// The bytes a weight form multiplies.
fn stored(packed: &PackedWeight) -> &RawBytes {
    match packed {
        PackedWeight::Blocks(m) => m.stored(),
        PackedWeight::KQuants(m) => m.stored(),
        PackedWeight::Bf16(_) | PackedWeight::Int8(_) => panic!("a float form from a GGUF load"),
    }
}

#[test]
fn the_blocks_multiplied_are_the_file_s_own_bytes_in_place() {
    let Some(files) = kquant_files() else { return };
    let (mut in_place, mut regrouped) = (0, 0);
    for path in files {
        let file = GgufFile::open_with(&path, FileMemory::Map).unwrap();
        // The reference: the file's bytes read on their own, not through the map.
        let reference = GgufFile::from_bytes(std::fs::read(&path).unwrap(), &path).unwrap();
        let names = &by_gguf_architecture(file.architecture().unwrap())
            .unwrap()
            .1
            .names;
        let mut model = load_gguf(&file, GgufWeights::Blocks).unwrap();
        // Each weight the model multiplies, by the file's name of it, and the embedding's rows
        // (looked up as stored, never regrouped).
        let mut weights: Vec<(String, Option<RawBytes>)> = Vec::new();
        for_each_linear(&mut model.blocks, |ours, linear| {
            let theirs = names.export(&format!("{ours}.weight")).unwrap();
            weights.push((theirs, linear.packed().map(|p| stored(p).clone())));
        });
        let tied = model.head.output_proj.is_none();
        let head = if tied { "token_embd.weight" } else { "output.weight" };
        weights.push((head.into(), model.head.packed().map(|p| stored(p).clone())));
        let embedding_rows = model.embedding.stored_rows().cloned();
        if let Some(rows) = &embedding_rows {
            let info = reference.tensor("token_embd.weight").unwrap();
            let mapped = file.tensor_data(info).unwrap();
            assert!(&rows[..] == reference.tensor_data(info).unwrap(), "{path:?}: rows");
            assert_eq!(rows.as_ptr(), mapped.as_ptr(), "{path:?}: rows copied");
            in_place += 1;
        }
        for (name, held) in weights {
            let what = format!("{name} of {}", path.display());
            let info = reference.tensor(&name).unwrap();
            let expected = reference.tensor_data(info).unwrap();
            let Some(held) = held else {
                assert!(!CPU.multiplies_blocks(info.ggml_type), "{what} is not multiplied in blocks");
                continue;
            };
            if CPU.copies_blocks(info.ggml_type) {
                // Regrouped into a copy, as the same transform of the file's bytes; the file's
                // pages of it were given back.
                let (rows, cols) = info.rows_cols();
                let copy = RawBytes::owned(expected.to_vec());
                let again = KQuantMatrix::from_ggml(info.ggml_type, copy, rows, cols).unwrap();
                assert!(held[..] == again.stored()[..], "{what}: not the regrouping");
                assert!(&held[..] != expected, "{what}: regrouping changed nothing");
                // Given back, unless the embedding looks its rows up in the same bytes.
                let shared = name == "token_embd.weight" && embedding_rows.is_some();
                assert_eq!(file.tensor_data(info).is_err(), !shared, "{what}: given back?");
                regrouped += 1;
            } else {
                // Byte for byte the file's, at the very address the map holds them.
                assert!(&held[..] == expected, "{what}: bytes differ from the file's");
                let mapped = file.tensor_data(info).unwrap();
                assert_eq!(held.as_ptr(), mapped.as_ptr(), "{what}: copied");
                in_place += 1;
            }
        }
    }
    if in_place + regrouped > 0 {
        assert!(in_place > 20 && regrouped > 4, "{in_place} in place, {regrouped} regrouped");
    }
}
