//! The guest's allocator: free lists of power-of-two blocks up to 32 KiB, carved from
//! 64 KiB chunks of std's allocator (dlmalloc), which keeps everything larger. A round
//! allocates and frees thousands of small buffers (decoded frames, votes, outputs), and
//! dlmalloc's malloc, free and unlinking were 7% of the wasm engine's time in
//! `phalanxd engine-bench`; a free-list push or pop is a few instructions. Blocks are never handed back to dlmalloc: each size class keeps the
//! most it ever held, at most twice what was asked for.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr::null_mut;

/// The smallest block; also the alignment every block has.
const MIN_BLOCK: usize = 16;
/// Classes of 16 B, 32 B, … 32 KiB.
const CLASSES: usize = 12;
const CHUNK: usize = 64 << 10;

pub struct SizeClasses {
    /// The first free block of each class; a free block holds the next one's address.
    free: UnsafeCell<[*mut u8; CLASSES]>,
}

// SAFETY: wasm32-unknown-unknown has no threads; nothing else ever touches the lists.
unsafe impl Sync for SizeClasses {}

impl SizeClasses {
    pub const fn new() -> Self {
        SizeClasses { free: UnsafeCell::new([null_mut(); CLASSES]) }
    }
}

/// The class of `layout`, or `None` for dlmalloc (too large, or aligned beyond a block's
/// own alignment).
fn class(layout: Layout) -> Option<usize> {
    if layout.align() > MIN_BLOCK {
        return None;
    }
    let size = layout.size().max(MIN_BLOCK).next_power_of_two();
    let class = (size.trailing_zeros() - MIN_BLOCK.trailing_zeros()) as usize;
    (class < CLASSES).then_some(class)
}

unsafe impl GlobalAlloc for SizeClasses {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = class(layout) else { return unsafe { System.alloc(layout) } };
        // SAFETY: single-threaded (see `Sync`), and no other borrow of the lists lives.
        let free = unsafe { &mut (*self.free.get())[class] };
        if free.is_null() {
            let block = MIN_BLOCK << class;
            // SAFETY: CHUNK and MIN_BLOCK make a valid, non-zero layout.
            let chunk = unsafe { System.alloc(Layout::from_size_align_unchecked(CHUNK, MIN_BLOCK)) };
            if chunk.is_null() {
                return chunk;
            }
            // Threads the chunk's blocks into the list, the first one on top.
            for offset in (0..CHUNK).step_by(block).rev() {
                // SAFETY: `offset` is inside the chunk, and blocks are aligned for a pointer.
                unsafe {
                    let b = chunk.add(offset);
                    *(b as *mut *mut u8) = *free;
                    *free = b;
                }
            }
        }
        let block = *free;
        // SAFETY: a free block holds the address of the next one.
        *free = unsafe { *(block as *mut *mut u8) };
        block
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(class) = class(layout) else { return unsafe { System.dealloc(ptr, layout) } };
        // SAFETY: as in `alloc`; `ptr` is a block of this class that nothing uses any more.
        unsafe {
            let free = &mut (*self.free.get())[class];
            *(ptr as *mut *mut u8) = *free;
            *free = ptr;
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with `layout.align()` is a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new)) {
            (Some(old), Some(new)) if old == new => ptr,
            (None, None) => unsafe { System.realloc(ptr, layout, new_size) },
            _ => {
                // SAFETY: as GlobalAlloc's own default: a new block, the common bytes, the
                // old block freed.
                unsafe {
                    let moved = self.alloc(new);
                    if !moved.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    moved
                }
            }
        }
    }
}
