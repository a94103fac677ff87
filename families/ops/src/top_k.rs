//! Selection: ggml's CPU `top_k` index set (tie order included) and the
//! greedy choice.

/// The index set ggml's CPU `top_k` returns for `data` (the first `k` of
/// `std::partial_sort` over indices `0..n` with `comp(a, b) = data[a] >
/// data[b]`), as libstdc++ implements it: `__heap_select` (make_heap on
/// the first `k`, then `pop_heap` in every later index that beats the heap
/// top). Only membership matters; the order is the heap's. A port of
/// `libstdcxx_top_k` in tools/oracle/qwen4exp_ref.py; it decides which
/// cells of a tied block are attended where scores tie (qwen4_exp's QSA
/// blocks, glm5_next's key pools).
pub fn libstdcxx_top_k(data: &[f64], k: usize) -> Vec<usize> {
    let n = data.len();
    if k >= n {
        return (0..n).collect();
    }
    let mut a: Vec<usize> = (0..n).collect();
    let comp = |x: usize, y: usize| data[x] > data[y];
    // Signed arithmetic with floor division, as the Python port has it.
    fn push_heap(
        a: &mut [usize],
        comp: &dyn Fn(usize, usize) -> bool,
        mut hole: isize,
        top: isize,
        value: usize,
    ) {
        let mut parent = (hole - 1).div_euclid(2);
        while hole > top && comp(a[parent as usize], value) {
            a[hole as usize] = a[parent as usize];
            hole = parent;
            parent = (hole - 1).div_euclid(2);
        }
        a[hole as usize] = value;
    }
    fn adjust_heap(
        a: &mut [usize],
        comp: &dyn Fn(usize, usize) -> bool,
        mut hole: isize,
        len: isize,
        value: usize,
    ) {
        let top = hole;
        let mut child = hole;
        while child < (len - 1).div_euclid(2) {
            child = 2 * (child + 1);
            if comp(a[child as usize], a[(child - 1) as usize]) {
                child -= 1;
            }
            a[hole as usize] = a[child as usize];
            hole = child;
        }
        if (len & 1) == 0 && child == (len - 2).div_euclid(2) {
            child = 2 * (child + 1);
            a[hole as usize] = a[(child - 1) as usize];
            hole = child - 1;
        }
        push_heap(a, comp, hole, top, value);
    }
    let ki = k as isize;
    if k >= 2 {
        let mut parent = (ki - 2).div_euclid(2);
        loop {
            let v = a[parent as usize];
            adjust_heap(&mut a, &comp, parent, ki, v);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    for i in k..n {
        if comp(a[i], a[0]) {
            let value = a[i];
            a[i] = a[0];
            adjust_heap(&mut a, &comp, 0, ki, value);
        }
    }
    a.truncate(k);
    a
}

/// The index of the first largest element (numpy's `argmax`, ggml's greedy
/// sampler): ties go to the lower index; 0 for an empty slice.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_largest() {
        assert_eq!(argmax(&[1.0, 3.0, -2.0, 3.0]), 1);
        assert_eq!(argmax(&[-1.0, -0.5]), 1);
        assert_eq!(argmax(&[2.0]), 0);
        assert_eq!(argmax(&[]), 0);
    }
}
