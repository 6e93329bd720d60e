//! Launch geometry shared by every engine and the CUDA driver layer: an explicit grid and block,
//! or a block size chosen for `n` elements.

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
    /// When set, the launch covers this many elements in x and a backend may re-pick the block
    /// size (CUDA asks the occupancy calculator) as long as the grid still covers them.
    pub elements: Option<u64>,
}

/// Smallest and largest block size the element heuristic picks.
pub const MIN_BLOCK: u32 = 64;
/// See [`MIN_BLOCK`].
pub const MAX_BLOCK: u32 = 512;

/// Block size for `n` elements: small launches use small blocks so several SMs get work,
/// mid-size launches 256 (a good default on every recent architecture), very large ones 512 to
/// cut the block count. Tiers: `n < 1024`: 64 (up to 511) or 128; `n <= 100_000`: 256;
/// above: 256, or 512 past one million.
pub fn block_size_for(n: u64) -> u32 {
    match n {
        0..=511 => 64,
        512..=1023 => 128,
        1024..=100_000 => 256,
        100_001..=1_000_000 => 256,
        _ => 512,
    }
}

/// The highest block size the heuristic allows for `n`; the occupancy calculator's suggestion
/// is clamped to it so a tiny launch is not packed into one huge block.
pub fn block_ceiling_for(n: u64) -> u32 {
    match n {
        0..=1023 => 128,
        1024..=100_000 => 256,
        _ => MAX_BLOCK,
    }
}

impl LaunchConfig {
    /// An explicit one-dimensional launch.
    pub fn new(grid: u32, block: u32) -> Self {
        LaunchConfig {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_bytes: 0,
            elements: None,
        }
    }

    /// A launch covering `n` elements with the block-size heuristic; CUDA refines the block size
    /// with `cuOccupancyMaxPotentialBlockSize` at launch.
    pub fn for_elements(n: u64) -> Self {
        let block = block_size_for(n);
        LaunchConfig {
            grid: (grid_for(n, block), 1, 1),
            block: (block, 1, 1),
            shared_bytes: 0,
            elements: Some(n),
        }
    }

    /// Uses `block` (from an occupancy query) within the heuristic's ceiling for `elements`.
    /// No effect on explicit launches.
    pub fn with_suggested_block(self, suggested: u32) -> Self {
        let Some(n) = self.elements else { return self };
        let block = suggested.clamp(32, block_ceiling_for(n)) / 32 * 32;
        LaunchConfig {
            grid: (grid_for(n, block), 1, 1),
            block: (block, 1, 1),
            ..self
        }
    }

    /// Dynamic shared memory per block.
    pub fn with_shared_bytes(self, bytes: u32) -> Self {
        LaunchConfig {
            shared_bytes: bytes,
            ..self
        }
    }

    /// Total threads the launch starts.
    pub fn threads(&self) -> u64 {
        let g = self.grid.0 as u64 * self.grid.1 as u64 * self.grid.2 as u64;
        let b = self.block.0 as u64 * self.block.1 as u64 * self.block.2 as u64;
        g * b
    }

    /// The index space a kernel should cover: `elements` when set, else every thread.
    pub fn index_space(&self) -> u64 {
        self.elements.unwrap_or_else(|| self.threads())
    }
}

fn grid_for(n: u64, block: u32) -> u32 {
    n.div_ceil(block as u64).clamp(1, u32::MAX as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_tiers() {
        for n in [1u64, 100, 511, 512, 1023] {
            let b = block_size_for(n);
            assert!((64..=128).contains(&b), "n={n} b={b}");
        }
        for n in [1024u64, 50_000, 100_000] {
            assert_eq!(block_size_for(n), 256, "n={n}");
        }
        for n in [100_001u64, 1_000_000, 1 << 30] {
            let b = block_size_for(n);
            assert!((256..=512).contains(&b), "n={n} b={b}");
        }
    }

    #[test]
    fn for_elements_covers_all() {
        for n in [1u64, 63, 64, 65, 1000, 100_000, 123_457, 10_000_000] {
            let c = LaunchConfig::for_elements(n);
            assert!(c.threads() >= n);
            assert!(
                c.threads() - n < c.block.0 as u64,
                "n={n}: one block too many"
            );
            assert_eq!(c.index_space(), n);
        }
        assert_eq!(LaunchConfig::for_elements(0).grid.0, 1);
    }

    #[test]
    fn suggestion_is_clamped_and_warp_multiple() {
        let c = LaunchConfig::for_elements(500).with_suggested_block(1024);
        assert_eq!(c.block.0, 128);
        assert!(c.threads() >= 500);
        let c = LaunchConfig::for_elements(10_000_000).with_suggested_block(500);
        assert_eq!(c.block.0, 480);
        assert!(c.threads() >= 10_000_000);
        let c = LaunchConfig::for_elements(10).with_suggested_block(7);
        assert_eq!(c.block.0, 32);
        let explicit = LaunchConfig::new(3, 100);
        assert_eq!(explicit.with_suggested_block(512), explicit);
        assert_eq!(explicit.index_space(), 300);
    }
}
