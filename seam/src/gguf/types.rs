//! The ggml tensor types: id, name, elements per block and bytes per block.
//!
//! The table is ggml's (`ggml.c` type traits) plus the ids some forks add
//! (40 NVFP4, 41 Q1_0, 42 Q2_0). Ids that upstream removed (4, 5, 31-33,
//! 36-38) are not types: reading one is an error, like any unknown id.

use std::fmt;

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block:literal, $bytes:literal;)*) => {
        /// A ggml tensor element type as stored in a GGUF tensor info.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $(
                #[doc = concat!("`", $name, "`: id ", stringify!($id), ", ", stringify!($block),
                    " elements in ", stringify!($bytes), " bytes per block.")]
                $variant,
            )*
        }

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type with this on-disk id, or `None` for an unknown or removed id.
            pub fn from_id(id: i32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// The on-disk id.
            pub fn id(self) -> i32 {
                match self { $(GgmlType::$variant => $id,)* }
            }

            /// The name ggml and gguf-py use (`"Q4_K"`, `"BF16"`).
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name,)* }
            }

            /// Elements per block (1 for plain scalar types).
            pub fn block_size(self) -> u64 {
                match self { $(GgmlType::$variant => $block,)* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self { $(GgmlType::$variant => $bytes,)* }
            }

            /// The type with this name (as [`GgmlType::name`] spells it).
            pub fn from_name(name: &str) -> Option<GgmlType> {
                match name {
                    $($name => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
    Q2_0 = 42, "Q2_0", 64, 18;
}

impl GgmlType {
    /// Bytes of a row of `ne0` elements, or `None` when `ne0` is not a
    /// whole number of blocks or the size overflows.
    pub fn row_bytes(self, ne0: u64) -> Option<u64> {
        if !ne0.is_multiple_of(self.block_size()) {
            return None;
        }
        (ne0 / self.block_size()).checked_mul(self.type_size())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::GgmlType;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
            assert!(t.block_size() > 0 && t.type_size() > 0);
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, -1, i32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None, "id {removed}");
        }
        assert_eq!(GgmlType::ALL.len(), 35);
    }

    #[test]
    fn reference_table_sizes() {
        let expect: &[(i32, u64, u64)] = &[
            (0, 1, 4),
            (2, 32, 18),
            (8, 32, 34),
            (9, 32, 36),
            (12, 256, 144),
            (14, 256, 210),
            (19, 256, 50),
            (20, 32, 18),
            (23, 256, 136),
            (29, 256, 56),
            (30, 1, 2),
            (34, 256, 54),
            (39, 32, 17),
            (40, 64, 36),
            (41, 128, 18),
            (42, 64, 18),
        ];
        for &(id, block, bytes) in expect {
            let t = GgmlType::from_id(id).unwrap();
            assert_eq!((t.block_size(), t.type_size()), (block, bytes), "{t}");
        }
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::F64.row_bytes(u64::MAX), None);
    }
}
