//! A size-class allocator for the Wasm module: small blocks (≤ 512 bytes, alignment ≤ 16) are
//! recycled through per-size free lists, everything else goes to the system allocator
//! (dlmalloc). The request path allocates and frees dozens of small strings and vectors per
//! request; a free-list pop/push is a handful of instructions where dlmalloc's malloc/free cost
//! far more under V8. Freed small blocks are kept for reuse (memory stays at the peak of live
//! small blocks per class).
//!
//! Only for single-threaded Wasm (no `atomics` target feature): the free lists are not
//! synchronized.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr::null_mut;

/// Size classes 8, 16, 32, …, 512 bytes.
const CLASSES: usize = 7;
const MAX_SMALL: usize = 8 << (CLASSES - 1);
const ALIGN: usize = 16;

pub struct SizeClassAlloc {
    heads: UnsafeCell<[*mut u8; CLASSES]>,
}

// SAFETY: the module runs single-threaded (wasm32 without the atomics feature).
unsafe impl Sync for SizeClassAlloc {}

impl SizeClassAlloc {
    pub const fn new() -> Self {
        SizeClassAlloc { heads: UnsafeCell::new([null_mut(); CLASSES]) }
    }
}

#[inline]
fn class_of(layout: &Layout) -> Option<usize> {
    if layout.size() > MAX_SMALL || layout.align() > ALIGN {
        return None;
    }
    let size = layout.size().max(8).next_power_of_two();
    Some(size.trailing_zeros() as usize - 3)
}

#[inline]
fn class_layout(class: usize) -> Layout {
    // SAFETY: power of two sizes ≥ 8 with alignment 16 are valid layouts.
    unsafe { Layout::from_size_align_unchecked((8usize << class).max(ALIGN), ALIGN) }
}

unsafe impl GlobalAlloc for SizeClassAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class_of(&layout) else { return System.alloc(layout) };
        let heads = &mut *self.heads.get();
        let Some(head) = heads.get_mut(c) else { return System.alloc(layout) };
        if head.is_null() {
            return System.alloc(class_layout(c));
        }
        let block = *head;
        // The first word of a free block links to the next one.
        *head = *(block as *mut *mut u8);
        block
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(c) = class_of(&layout) else { return System.dealloc(ptr, layout) };
        let heads = &mut *self.heads.get();
        let Some(head) = heads.get_mut(c) else { return System.dealloc(ptr, layout) };
        *(ptr as *mut *mut u8) = *head;
        *head = ptr;
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        match (class_of(&layout), class_of(&new_layout)) {
            (Some(a), Some(b)) if a == b => ptr,
            (None, None) => System.realloc(ptr, layout, new_size),
            _ => {
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            }
        }
    }
}
