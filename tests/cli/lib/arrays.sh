# Writers of the tensors data source's files, in shell alone (no numpy):
# source after `set -u`. Data comes from raw little-endian files.
#
#   npy_file PATH MAJOR DESCR SHAPE RAW [FORTRAN]
#     a .npy of version MAJOR.0 (1: u16 header length; 2 and 3: u32) with
#     header {'descr': DESCR, 'fortran_order': FORTRAN (False), 'shape': SHAPE}
#     (SHAPE as Python writes it: "(96, 4)", "(96,)"), padded with spaces so
#     the data starts at a multiple of 64, then the bytes of RAW.
#   st_file PATH NAME DTYPE SHAPE RAW [NAME DTYPE SHAPE RAW]...
#     a safetensors file (SHAPE as JSON: "[96,4]") with the tensors in order.
#   blob_xy N SEED XRAW YRAW
#     N examples of 3 classes: x f32[N,4], with x[c] = 2 for class c and the
#     other features drawn from {-1, 0, 1}; y i32[N] = c (bash's $RANDOM
#     seeded by SEED picks them).

# little-endian u16 and u32 as bytes
arr_le16() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $(($1 >> 8 & 255)))"; }
arr_le32() { arr_le16 $(($1 & 65535)); arr_le16 $(($1 >> 16 & 65535)); }

npy_file() {
    local path=$1 major=$2 descr=$3 shape=$4 raw=$5 fortran=${6:-False}
    local dict="{'descr': '$descr', 'fortran_order': $fortran, 'shape': $shape, }"
    local pre=10
    [ "$major" -ge 2 ] && pre=12
    local len=$((${#dict} + 1)) # the '\n'
    local pad=$(((64 - (pre + len) % 64) % 64))
    {
        printf '\223NUMPY'
        printf "\\$(printf %03o "$major")\\000"
        if [ "$major" -ge 2 ]; then arr_le32 $((len + pad)); else arr_le16 $((len + pad)); fi
        printf '%s%*s\n' "$dict" "$pad" ''
        cat "$raw"
    } > "$path"
}

st_file() {
    local path=$1
    shift
    local json='{' off=0 sep='' args=("$@")
    while [ $# -gt 0 ]; do
        local n
        n=$(stat -c %s "$4")
        json="$json$sep\"$1\":{\"dtype\":\"$2\",\"shape\":$3,\"data_offsets\":[$off,$((off + n))]}"
        off=$((off + n))
        sep=','
        shift 4
    done
    json="$json}"
    {
        arr_le32 ${#json}
        arr_le32 0
        printf '%s' "$json"
        set -- "${args[@]}"
        while [ $# -gt 0 ]; do cat "$4"; shift 4; done
    } > "$path"
}

blob_xy() {
    local n=$1 xf=$3 yf=$4
    RANDOM=$2
    # f32 -1, 0, 1, 2 and i32 0, 1, 2 as octal escapes
    local f=('\000\000\200\277' '\000\000\000\000' '\000\000\200\077') two='\000\000\000\100'
    local xs='' ys=''
    for ((i = 0; i < n; i++)); do
        local c=$((RANDOM % 3))
        for ((k = 0; k < 4; k++)); do
            if [ "$k" -eq "$c" ]; then xs="$xs$two"; else xs="$xs${f[RANDOM % 3]}"; fi
        done
        ys="$ys\\00$c\\000\\000\\000"
    done
    printf "$xs" > "$xf"
    printf "$ys" > "$yf"
}

# bars_xy N SEED XRAW YRAW [S]
#   N images f32[N,1,S,S] (S default 8) of 3 classes: a bar of 3 bright
#   pixels (1.0), class 0 horizontal, 1 vertical, 2 diagonal, at a random
#   place, over background noise from {0, 0.25, 0.5}; y i32[N] = the class.
#   Where the bar lies varies, so no fixed pixel tells the class: a
#   convolution's shared filters do (models/cnn.lua).
bars_xy() {
    local n=$1 xf=$3 yf=$4 s=${5:-8}
    RANDOM=$2
    local f=('\000\000\000\000' '\000\000\200\076' '\000\000\000\077') one='\000\000\200\077'
    : > "$xf"
    : > "$yf"
    local ys=''
    for ((i = 0; i < n; i++)); do
        local c=$((RANDOM % 3)) r0=$((RANDOM % (s - 2))) c0=$((RANDOM % (s - 2)))
        local dr=$((c == 0 ? 0 : 1)) dc=$((c == 1 ? 0 : 1))
        local -A bar=()
        for ((k = 0; k < 3; k++)); do bar[$((r0 + k * dr)),$((c0 + k * dc))]=1; done
        local xs=''
        for ((r = 0; r < s; r++)); do
            for ((q = 0; q < s; q++)); do
                if [ -n "${bar[$r,$q]:-}" ]; then xs="$xs$one"; else xs="$xs${f[RANDOM % 3]}"; fi
            done
        done
        unset bar
        printf "$xs" >> "$xf"
        ys="$ys\\00$c\\000\\000\\000"
    done
    printf "$ys" > "$yf"
}
