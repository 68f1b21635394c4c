-- nn.lua - kiln's layer library, the global `nn` in model scripts. Written
-- only with the DSL's primitives (docs/dsl.md), so autodiff needs no rule
-- per layer. Weight layout: a linear layer's weight is [din, dout], so
-- y = x:matmul(w) (the layout of GPT-2's Conv1D checkpoints).
--
-- Functions take tensors and return tensors. Constructors (capitalised)
-- declare params under a name prefix and return a callable layer:
--   local fc = nn.Linear("h.0.mlp.c_fc", C, 4*C)   -- params h.0.mlp.c_fc.weight/.bias
--   local y = fc(x)
-- Shapes: B batch, T time, C channels, H heads, D = C/H head size.
-- A size argument (din, dout, dim, C, hidden, n) is a number or a name
-- declared with sym{} ("C"): a name goes into the params' shapes as it is,
-- so their dims print as that name; size(C) is its number (docs/dsl.md).

local nn = {}

-- check_opts(fn, opts, spec): every options table is checked against the
-- keys its function accepts ("key:type ..."; type "-": documented, not
-- implemented), so a misspelled or unknown option is an error at the
-- user's line naming the closest key (fe_check_opts in frontend.c).
local check_opts = ...

-- the read-only stand-in getmetatable gives for kiln's values (docs/dsl.md,
-- Sandbox): layers' metatables are locked with it too
local LOCKED = getmetatable("")

-- true while kiln builds the training step; false while it builds the
-- evaluation graph (the script runs a second time), where dropout is off.
nn.training = true

local function layer(t, f)
  return setmetatable(t, {__call = function(_, ...) return f(...) end, __metatable = LOCKED})
end

-- y = x @ w (+ b); x [..., din], w [din, dout], b [dout] or nil.
function nn.linear(x, w, b)
  local y = matmul(x, w)
  if b then y = y + b end
  return y
end

-- opts: bias (default true), std (default 0.02), init (overrides std),
-- parallel ("column": w and b split by output columns over the
-- tensor-parallel group; "row": w split by input rows, b whole).
function nn.Linear(name, din, dout, opts)
  check_opts("nn.Linear", opts, "bias:boolean std:number init:init parallel:string")
  opts = opts or {}
  local w = param(name .. ".weight", {din, dout}, opts.init or normal(opts.std or 0.02))
  local b
  if opts.bias ~= false then b = param(name .. ".bias", {dout}, zeros()) end
  if opts.parallel == "column" then
    shard(w, 1)
    if b then shard(b, 0) end
  elseif opts.parallel == "row" then
    shard(w, 0)
  elseif opts.parallel ~= nil then
    error("nn.Linear: parallel must be \"column\" or \"row\" (got \"" ..
          tostring(opts.parallel) .. "\")", 2)
  end
  return layer({w = w, b = b}, function(x) return nn.linear(x, w, b) end)
end

-- Layer normalisation over the last axis; w, b [C] (b may be nil).
function nn.layernorm(x, w, b, eps)
  local mu = x:mean(-1, true)
  local xc = x - mu
  local var = (xc * xc):mean(-1, true)
  local y = xc * rsqrt(var + (eps or 1e-5)) * w
  if b then y = y + b end
  return y
end

function nn.LayerNorm(name, dim, opts)
  check_opts("nn.LayerNorm", opts, "bias:boolean eps:number")
  opts = opts or {}
  local w = param(name .. ".weight", {dim}, ones())
  local b
  if opts.bias ~= false then b = param(name .. ".bias", {dim}, zeros()) end
  return layer({w = w, b = b}, function(x) return nn.layernorm(x, w, b, opts.eps) end)
end

-- RMS normalisation over the last axis; w [C].
function nn.rmsnorm(x, w, eps)
  local ms = (x * x):mean(-1, true)
  return x * rsqrt(ms + (eps or 1e-5)) * w
end

function nn.RMSNorm(name, dim, opts)
  check_opts("nn.RMSNorm", opts, "eps:number")
  opts = opts or {}
  local w = param(name .. ".weight", {dim}, ones())
  return layer({w = w}, function(x) return nn.rmsnorm(x, w, opts.eps) end)
end

-- GELU, tanh approximation (GPT-2's).
function nn.gelu(x)
  local k = math.sqrt(2 / math.pi)
  return 0.5 * x * (1 + tanh(k * (x + 0.044715 * x * x * x)))
end

function nn.silu(x) return x * sigmoid(x) end

-- GELU, exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
function nn.gelu_exact(x)
  return 0.5 * x * (1 + erf(x * (1 / math.sqrt(2))))
end

-- softplus(x) = log(1 + exp(x)), in a form that neither overflows nor
-- loses small values: max(x, 0) + log(1 + exp(-|x|)).
function nn.softplus(x)
  return relu(x) + log(1 + exp(-abs(x)))
end

local function axis_of(x, axis)
  axis = axis or -1
  local a = axis < 0 and x.rank + axis or axis
  if a < 0 or a >= x.rank then
    error(string.format("axis %d out of range for a tensor of rank %d", axis, x.rank), 3)
  end
  return a
end

-- log(sum(exp(x))) over axis (default -1), reduced axis kept with keepdim.
function nn.logsumexp(x, axis, keepdim)
  local a = axis_of(x, axis)
  local m = stop_gradient(x:max(a, true))
  local r = log(exp(x - m):sum(a, true)) + m
  if keepdim then return r end
  local s = r.shape
  table.remove(s, a + 1)
  return r:reshape(s)
end

-- Lua's // and % for tensors (the operators call these): floor division
-- and the remainder with the divisor's sign; integers stay integers.
function nn.floor_div(a, b)
  local t = type(a) == "userdata" and a or b
  if t.dtype ~= "i32" and t.dtype ~= "i64" then
    return floor(a / b)
  end
  local q = a / b                        -- integer division truncates
  local r = a - q * b
  local neg_r = type(r) == "userdata" and r:lt(0) or nil
  local neg_b = type(b) == "userdata" and b:lt(0) or (b < 0 and 1 or 0)
  -- q - 1 where the remainder is nonzero and its sign differs from b's
  local off
  if type(neg_b) == "number" then
    off = neg_b == 1 and r:gt(0) or r:lt(0)
  else
    off = r:ne(0) * neg_r:ne(neg_b)
  end
  return q - off:cast(q.dtype)
end

function nn.floor_mod(a, b)
  return a - nn.floor_div(a, b) * b
end

-- One-hot encoding: integer idx [...] -> [..., n] of dtype (default f32).
function nn.one_hot(idx, n, dtype)
  local s = idx.shape
  s[#s + 1] = 1
  local full = idx.shape
  full[#full + 1] = n
  return iota(full, -1, idx.dtype):eq(idx:reshape(s)):cast(dtype or "f32")
end

-- Index of the largest element along axis (default -1; the first one on
-- ties), i32; the axis is dropped unless keepdim.
function nn.argmax(x, axis, keepdim)
  local a = axis_of(x, axis)
  local n = x.shape[a + 1]
  local idx = iota(x.shape, a, "i32")
  local cand = select(x:eq(x:max(a, true)), idx, n)
  return cand:min(a, keepdim)
end

-- The k largest elements along the last axis and their indices (i32), in
-- descending order: values [..., k] (differentiable), indices [..., k].
function nn.topk(x, k)
  local n = x.shape[x.rank]
  if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
    error(string.format("nn.topk: k must be an integer in 1..%d (got %s)", n, tostring(k)), 2)
  end
  local vals, idxs, rest = {}, {}, x
  local col = iota(x.shape, x.rank - 1, "i32")
  for _ = 1, k do
    local i = nn.argmax(rest, -1, true)
    local hot = col:eq(i)
    vals[#vals + 1] = select(hot, x, 0):sum(-1, true)
    idxs[#idxs + 1] = i
    rest = select(hot, -math.huge, rest)
  end
  return concat(vals, -1), concat(idxs, -1)
end

-- Inclusive cumulative sum along axis (default -1): log2(n) shifted adds
-- (Hillis-Steele), so the graph is O(n log n) work and differentiable.
function nn.cumsum(x, axis)
  local a = axis_of(x, axis)
  local n = x.shape[a + 1]
  local shift = 1
  while shift < n do
    x = x + x:slice(a, 0, n - shift):pad(a, shift, 0)
    shift = shift * 2
  end
  return x
end

-- Pieces of x along axis: split(x, {sizes}, axis) or split(x, size, axis)
-- (pieces of `size`, the last one shorter); returns a table.
function nn.split(x, sizes, axis)
  local a = axis_of(x, axis)
  local n = x.shape[a + 1]
  if type(sizes) == "number" then
    local s = {}
    for at = 0, n - 1, sizes do s[#s + 1] = math.min(sizes, n - at) end
    sizes = s
  end
  local out, at = {}, 0
  for _, len in ipairs(sizes) do
    out[#out + 1] = x:slice(a, at, at + len)
    at = at + len
  end
  if at ~= n then
    error(string.format("nn.split: sizes add up to %d (expected %d, the axis' length)", at, n), 2)
  end
  return out
end

-- n pieces of (nearly) equal size along axis, as torch.chunk.
function nn.chunk(x, n, axis)
  local len = x.shape[axis_of(x, axis) + 1]
  return nn.split(x, math.ceil(len / n), axis)
end

-- Drop a size-1 axis / insert one at axis.
function nn.squeeze(x, axis)
  local a = axis_of(x, axis)
  local s = x.shape
  if s[a + 1] ~= 1 then
    error(string.format("nn.squeeze: axis %d has size %d (expected 1)", a, s[a + 1]), 2)
  end
  table.remove(s, a + 1)
  return x:reshape(s)
end

function nn.unsqueeze(x, axis)
  local a = axis < 0 and x.rank + 1 + axis or axis
  local s = x.shape
  table.insert(s, a + 1, 1)
  return x:reshape(s)
end

-- softmax and log_softmax subtract the row max for range only: the result
-- does not depend on it, so it is a stop_gradient (its gradient is zero
-- analytically; differentiating it would only add rounding noise, a
-- reduction and a saved argmax mask to backward).
function nn.softmax(x, axis)
  axis = axis or -1
  local e = exp(x - stop_gradient(x:max(axis, true)))
  return e / e:sum(axis, true)
end

function nn.log_softmax(x, axis)
  axis = axis or -1
  local z = x - stop_gradient(x:max(axis, true))
  return z - log(exp(z):sum(axis, true))
end

-- Mean over tokens of -log p(target) = logsumexp(logits) - logits[target].
-- logits [..., V] float, targets [...] i32/i64 (a target outside [0, V)
-- reads logit 0). With mask [...] (f32, 1 = counts): sum(mask*nll) /
-- sum(mask).
-- opts.classes: the real classes when the last axis of logits is padded
-- (nn.pad_vocab): columns from classes on are masked to -inf, so they add
-- nothing to the loss and get no gradient.
function nn.cross_entropy(logits, targets, mask, opts)
  check_opts("nn.cross_entropy", opts, "classes:integer")
  -- options in the mask's place would be read as a mask
  if mask ~= nil and (type(mask) ~= "userdata" or not mask.rank) then
    error(string.format("nn.cross_entropy: mask (the third argument) must be a tensor or nil " ..
                        "(got %s; options such as {classes = n} are the fourth argument)",
                        type(mask)), 2)
  end
  -- float targets would be compared for equality with the class index
  if targets.dtype ~= "i32" and targets.dtype ~= "i64" then
    error(string.format("nn.cross_entropy: targets must be an integer tensor of class " ..
                        "indices (expected i32/i64, got %s[%s])", targets.dtype,
                        table.concat(targets.shape, ",")), 2)
  end
  -- one pass over each row (an online max and sum), the target logit
  -- picked in the same kernel; the backward is softmax minus one-hot,
  -- stored by that kernel too
  local V, all = logits.shape[#logits.shape], logits
  if opts and opts.classes and opts.classes < V then
    all = nn.mask_classes(logits, opts.classes)
  end
  -- the target logit from the unmasked logits (a target is a real class),
  -- so the masked ones stay inside the loss kernel. It is the row's sum
  -- of the logits at the target's class (exact: one term, the rest 0), not
  -- a take_along: a row reduction the loss kernel folds as it reads the
  -- row, so nothing reads the logits after that kernel, which then writes
  -- the gradient over them (one logits-sized buffer: docs/fusion.md)
  local hit = iota(logits.shape, -1, targets.dtype):eq(nn.unsqueeze(targets, -1))
  local nll = all:logsumexp(-1) - select(hit, logits, 0):sum(-1)
  if mask then
    local m = mask:cast(nll.dtype)
    return (m * nll):sum() / maximum(m:sum(), 1)
  end
  return nll:mean()
end

-- Vocabulary padding: n rounded up to a multiple of `multiple` (nil, 0 or
-- 1: n itself). GEMMs over a padded vocabulary get aligned leading
-- dimensions (50257 -> 50304 for 64).
function nn.pad_vocab(n, multiple)
  if not multiple or multiple <= 1 then return n end
  n = size(n)
  return (n + multiple - 1) // multiple * multiple
end

-- logits [..., Vp] with columns from `classes` on set to -inf (padding):
-- no probability, no gradient.
function nn.mask_classes(logits, classes)
  local keep = iota(logits.shape, -1):lt(classes)
  return select(keep, logits, -math.huge)
end

-- table [V, C], idx [...] integer -> [..., C]
function nn.embedding(tbl, idx) return gather(tbl, idx) end

-- opts.pad: pad the rows to a multiple (nn.pad_vocab); rows from n on are
-- padding (padded_rows: weights of n rows import into it), and the
-- layer's .rows is the padded count, .n the real one.
-- opts.parallel = "vocab": the rows are split over the tensor-parallel
-- group (a vocabulary-parallel embedding and, tied, output head).
function nn.Embedding(name, n, dim, opts)
  check_opts("nn.Embedding", opts, "std:number pad:integer init:init parallel:string")
  opts = opts or {}
  local rows, count = nn.pad_vocab(n, opts.pad), size(n)
  -- padded rows are no longer n: the padded count prints as a number
  local w = param(name .. ".weight", {rows, dim}, opts.init or normal(opts.std or 0.02))
  if size(rows) > count then padded_rows(w, count) end
  if opts.parallel == "vocab" then
    shard(w, 0)
  elseif opts.parallel ~= nil then
    error("nn.Embedding: parallel must be \"vocab\" (got \"" .. tostring(opts.parallel) ..
          "\")", 2)
  end
  return layer({w = w, n = count, rows = size(rows)}, function(idx) return gather(w, idx) end)
end

-- Inverted dropout: keeps each element with probability 1-p, scaled by
-- 1/(1-p). p = 0 (or nil), or evaluation (nn.training false), returns x
-- unchanged and adds no op.
function nn.dropout(x, p)
  if not p or p == 0 then return x end
  assert(p > 0 and p < 1, "dropout: p must be in [0, 1)")
  if not nn.training then return x end
  local keep = random(x.shape):ge(p)
  return select(keep, x * (1 / (1 - p)), 0)
end

-- [B, T, C] -> [B, H, T, C/H]
function nn.split_heads(x, H)
  local s = x.shape
  local B, T, C = s[1], s[2], s[3]
  return x:reshape{B, T, H, C // H}:permute{0, 2, 1, 3}
end

-- [B, H, T, D] -> [B, T, H*D]
function nn.merge_heads(x)
  local s = x.shape
  local B, H, T, D = s[1], s[2], s[3], s[4]
  return x:permute{0, 2, 1, 3}:reshape{B, T, H * D}
end

-- u8 [T, T] mask, 1 where key position <= query position.
function nn.causal_mask(T)
  return iota({T, T}, 0):ge(iota({T, T}, 1))
end

local function tensor_str(t)
  if type(t) ~= "userdata" or not t.rank then return type(t) end
  return t.dtype .. "[" .. table.concat(t.shape, ",") .. "]"
end

-- k or v [..., Hk, T, D] with each head repeated g times in place (head h
-- of the result is head h // g): grouped-query attention's keys and values
-- for Hk * g query heads, the form the attention pass reads back as GQA.
local function repeat_heads(x, g)
  local s = x.shape
  local r = #s
  local five, out = {}, {}
  for i = 1, r - 3 do five[i], out[i] = s[i], s[i] end
  local Hk, T, D = s[r - 2], s[r - 1], s[r]
  five[r - 2], five[r - 1], five[r], five[r + 1] = Hk, 1, T, D
  out[r - 2], out[r - 1], out[r] = Hk * g, T, D
  local wide = {table.unpack(five)}
  wide[r - 1] = g
  return reshape(broadcast_to(reshape(x, five), wide), out)
end

-- ALiBi's slopes (Press et al.) as f32 [H, 1, 1]: 2^(-8(h+1)/H) for H a
-- power of two, else the n = 2^floor(log2 H) slopes of n followed by every
-- other slope of 2n (2^(-4(2m+1)/n) for h = n + m); ir_alibi_slope in C.
local function alibi_slopes(H)
  local n = 1
  while n * 2 <= H do n = n * 2 end
  local h = iota({H, 1, 1}, 0, "f32")
  local ln2 = math.log(2)
  local first = exp((h + 1) * (-8 * ln2 / n))
  if n == H then return first end
  local rest = exp((h - n) * (-8 * ln2 / n) + (-4 * ln2 / n))
  return select(h:lt(n), first, rest)
end

-- Scaled dot-product attention. q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv]
-- -> [..., Tq, Dv]; usually [B, H, T, D]. opts: causal (default true; needs
-- Tq == Tk), dropout (probability on the weights), kv_heads (k and v have
-- fewer heads than q: grouped-query attention; read from k's shape, the
-- option only checks it), window (causal sliding window: query i sees keys
-- i - window < j <= i), alibi (true: ALiBi's linear bias slope_h * (j - i),
-- h the axis before Tq), bias (a float tensor added to the scores) and mask
-- (a u8 tensor, 1 where a key is kept), each broadcastable to the scores
-- [..., Tq, Tk] (the fused kernels read them at their own shape; a bias that
-- needs a gradient, a param's function, runs unfused).
function nn.attention(q, k, v, opts)
  check_opts("nn.attention", opts,
             "causal:boolean dropout:number kv_heads:integer window:integer alibi:boolean " ..
             "bias:tensor mask:tensor")
  opts = opts or {}
  local names = {"q", "k", "v"}
  for i, t in ipairs({q, k, v}) do
    if type(t) ~= "userdata" or not t.rank or t.rank < 2 then
      error(string.format("nn.attention: %s must be a tensor [..., T, D] of rank >= 2 " ..
                          "(expected e.g. [B, H, T, D], got %s)", names[i], tensor_str(t)), 2)
    end
  end
  local s, ks, vs = q.shape, k.shape, v.shape
  local T, D = s[#s - 1], s[#s]
  if k.rank ~= q.rank or v.rank ~= q.rank or ks[#ks] ~= D or vs[#vs - 1] ~= ks[#ks - 1] then
    error(string.format("nn.attention: q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv] " ..
                        "must agree (got q %s, k %s, v %s)", tensor_str(q), tensor_str(k),
                        tensor_str(v)), 2)
  end
  -- the leading dims ([B, H]) of q, k and v must agree (or be 1), except
  -- that k and v may have fewer heads (the axis before T) than q when
  -- theirs divides q's: grouped-query attention
  local hax = #s - 2
  local gqa = hax >= 1 and ks[hax] == vs[hax] and ks[hax] ~= s[hax] and
              s[hax] % ks[hax] == 0
  for i = 1, #s - 2 do
    local a, b, c = s[i], ks[i], vs[i]
    if not (i == hax and gqa) and
       ((b ~= a and b ~= 1 and a ~= 1) or (c ~= a and c ~= 1 and a ~= 1) or
        (b ~= c and b ~= 1 and c ~= 1)) then
      error(string.format("nn.attention: q, k and v must have the same leading dims (expected " ..
                          "k and v [..., %s, Tk, D] like q, or fewer key/value heads that " ..
                          "divide q's, got q %s, k %s, v %s)", tostring(a), tensor_str(q),
                          tensor_str(k), tensor_str(v)), 2)
    end
  end
  if opts.kv_heads ~= nil then
    local kh = hax >= 1 and ks[hax] or 1
    if opts.kv_heads ~= kh or hax < 1 then
      error(string.format("nn.attention: kv_heads = %d does not match k and v (expected " ..
                          "%d key/value heads in the axis before Tk, got k %s and v %s; q %s)",
                          opts.kv_heads, opts.kv_heads, tensor_str(k), tensor_str(v),
                          tensor_str(q)), 2)
    end
  end
  if opts.causal ~= false and ks[#ks - 1] ~= T then
    error(string.format("nn.attention: causal attention needs as many keys as queries " ..
                        "(expected Tk = %d, got k %s)", T, tensor_str(k)), 2)
  end
  if opts.window ~= nil and (opts.causal == false or opts.window < 1) then
    error(string.format("nn.attention: window needs causal attention and window >= 1 " ..
                        "(got window = %d, causal = %s)", opts.window,
                        tostring(opts.causal ~= false)), 2)
  end
  -- bias and mask: broadcastable to the scores [..., Tq, Tk]
  local sc = {table.unpack(s, 1, #s - 1)}
  sc[#sc + 1] = ks[#ks - 1]
  for _, key in ipairs({"bias", "mask"}) do
    local t = opts[key]
    if t ~= nil then
      local ts, ok = t.shape, t.rank <= #sc
      for i = 1, ok and t.rank or 0 do
        local want = sc[#sc - t.rank + i]
        if ts[i] ~= want and ts[i] ~= 1 then ok = false end
      end
      local dt_ok = key == "mask" and t.dtype == "u8" or
                    key == "bias" and (t.dtype == "f32" or t.dtype == "bf16" or t.dtype == "f16")
      if not ok or not dt_ok then
        error(string.format("nn.attention: %s must be %s broadcastable to the scores [%s] " ..
                            "(got %s)", key, key == "mask" and "a u8 tensor (1: keep)" or
                            "a float tensor", table.concat(sc, ","), tensor_str(t)), 2)
      end
    end
  end
  if gqa then
    k, v = repeat_heads(k, s[hax] // ks[hax]), repeat_heads(v, s[hax] // ks[hax])
  end
  if nn.decode and opts.causal ~= false then
    if opts.window ~= nil or opts.alibi or opts.bias ~= nil or opts.mask ~= nil then
      -- kiln sample then reruns the full forward (docs/inference.md)
      error("nn.attention: the KV-cache decode step has no window, alibi, bias or mask yet", 2)
    end
    return nn.decode_attention(q, k, v)
  end
  local att = matmul(q, k, {tb = true}) * (1 / math.sqrt(D))
  if opts.alibi then
    local H = hax >= 1 and s[hax] or 1
    local rel = (iota({T, T}, 1) - iota({T, T}, 0)):cast("f32")
    att = att + (alibi_slopes(H) * rel):cast(att.dtype)
  end
  if opts.bias then
    att = att + opts.bias:cast(att.dtype)
  end
  if opts.mask then
    att = select(opts.mask, att, -1e9)
  end
  if opts.causal ~= false then
    att = select(nn.causal_mask(T), att, -1e9)
  end
  if opts.window then
    att = select((iota({T, T}, 0) - iota({T, T}, 1)):lt(opts.window), att, -1e9)
  end
  att = nn.dropout(nn.softmax(att, -1), opts.dropout)
  return matmul(att, v)
end

-- Decode mode (kiln sample; nn.decode set, docs/inference.md): causal
-- attention of the step's S queries over a KV cache. x [..., S, D] is
-- written into its cache [..., T, D] at positions pos..pos+S-1 (S = 1; or
-- S = T at pos 0, the prefill), which is kept for the next step; query i
-- attends to the filled keys j <= pos + i.
local function kv_cache(x)
  local old = nn.decode.state(x)
  local s, S = old.shape, x.shape[x.rank - 1]
  local new = x
  if S ~= s[#s - 1] then
    assert(S == 1, "decode steps are 1 token or the whole window")
    new = select(iota(s, #s - 2):eq(nn.decode.pos), x, old)
  end
  nn.decode.update(old, new)
  return new
end

function nn.decode_attention(q, k, v)
  local kc, vc = kv_cache(k), kv_cache(v)
  local S, Tk, D = q.shape[q.rank - 1], kc.shape[kc.rank - 1], q.shape[q.rank]
  local att = matmul(q, kc, {tb = true}) * (1 / math.sqrt(D))
  local keep = iota({S, Tk}, 1):le(iota({S, Tk}, 0) + nn.decode.pos)
  att = select(keep, att, -1e9)
  return matmul(nn.softmax(att, -1), vc)
end

-- Rotary position embedding (rotate-half form, as in Llama).
-- x [B, H, T, D], D even; base default 10000.
function nn.rope(x, base)
  base = base or 10000
  local s = x.shape
  local T, D = s[3], s[4]
  local half = D // 2
  -- inv_freq[i] = base^(-2i/D); angle [T, half] = t * inv_freq[i]
  local inv = exp(iota({T, half}, 1, "f32") * (-2 * math.log(base) / D))
  local t = iota({T, half}, 0, "f32")
  if nn.decode then t = (iota({T, half}, 0) + nn.decode.pos):cast("f32") end
  local ang = t * inv
  local c, sn = cos(ang):cast(x.dtype), sin(ang):cast(x.dtype)
  local x1, x2 = x:slice(-1, 0, half), x:slice(-1, half, D)
  return concat({x1 * c - x2 * sn, x1 * sn + x2 * c}, -1)
end

-- Causal multi-head self-attention, GPT-2 style: one fused qkv projection
-- c_attn [C, C + 2 * kv_heads * C/H] (q, then k, then v) and an output
-- projection c_proj [C, C].
-- opts: bias (true), std (0.02), proj_std (std of c_proj), dropout (0),
-- kv_heads (H: grouped-query attention with fewer key/value heads, a
-- divisor of H), window, alibi, mask (as nn.attention's), attn_bias
-- (nn.attention's bias).
function nn.CausalSelfAttention(name, C, H, opts)
  check_opts("nn.CausalSelfAttention", opts,
             "bias:boolean std:number proj_std:number dropout:number parallel:boolean " ..
             "kv_heads:integer " ..
             "window:integer alibi:boolean mask:tensor attn_bias:tensor")
  opts = opts or {}
  local c = size(C)
  local Hk = opts.kv_heads or H
  if Hk < 1 or H % Hk ~= 0 then
    error(string.format("nn.CausalSelfAttention: kv_heads must divide the %d heads " ..
                        "(got kv_heads = %d)", H, Hk), 2)
  end
  local ck = c // H * Hk
  local qkv = nn.Linear(name .. ".c_attn", C, c + 2 * ck, {bias = opts.bias, std = opts.std})
  local proj = nn.Linear(name .. ".c_proj", C, C,
                         {bias = opts.bias, std = opts.proj_std or opts.std,
                          parallel = opts.parallel and "row" or nil})
  if opts.parallel then
    if Hk ~= H then
      error(string.format("nn.CausalSelfAttention: parallel = true splits c_attn in three " ..
                          "equal blocks, so it needs kv_heads = heads (got kv_heads = %d " ..
                          "of %d heads)", Hk, H), 2)
    end
    -- split by heads: each rank's q, k and v columns of c_attn
    shard(qkv.w, 1, 3)
    if qkv.b then shard(qkv.b, 0, 3) end
  end
  local aopts = {dropout = opts.dropout, window = opts.window, alibi = opts.alibi,
                 mask = opts.mask, bias = opts.attn_bias}
  return layer({c_attn = qkv, c_proj = proj}, function(x)
    local a = qkv(x)
    local q = nn.split_heads(a:slice(-1, 0, c), H)
    local k = nn.split_heads(a:slice(-1, c, c + ck), Hk)
    local v = nn.split_heads(a:slice(-1, c + ck, c + 2 * ck), Hk)
    local y = nn.merge_heads(nn.attention(q, k, v, aopts))
    return nn.dropout(proj(y), opts.dropout)
  end)
end

-- ---- convolution, pooling, normalisation over channels -----------------
-- Images are NCL (1d) or NCHW (2d). A convolution is im2col (the patches,
-- one row per output position, ir.h) times the weight as one GEMM; its
-- gradient is a GEMM and col2im, so no slice or concat is involved.

-- a number or a table of ns numbers -> a table of ns numbers
local function per_dim(v, ns, def)
  if v == nil then v = def end
  if type(v) == "number" then
    local t = {}
    for i = 1, ns do t[i] = v end
    return t
  end
  return v
end

local function shape_str(t)
  return t.dtype .. "[" .. table.concat(t.shape, ",") .. "]"
end

-- y = conv(x, w) + b: x [N, C, D...] (ns = 1 or 2 spatial dims), w [Cout,
-- C/groups, k...], b [Cout] or nil -> [N, Cout, O...].
local function conv(fn, ns, x, w, b, o)
  o = o or {}
  if type(x) ~= "userdata" or not x.rank or x.rank ~= ns + 2 then
    error(string.format("%s: x must be a tensor %s (got %s)", fn,
                        ns == 1 and "[N, C, L]" or "[N, C, H, W]",
                        type(x) == "userdata" and x.rank and shape_str(x) or type(x)), 3)
  end
  local ws, xs = w.shape, x.shape
  local G, cout = o.groups or 1, ws[1]
  if xs[2] ~= ws[2] * G then
    error(string.format("%s: x has %d channels (expected %d = in_channels of the weight %s " ..
                        "x groups %d; got x %s)", fn, xs[2], ws[2] * G, shape_str(w), G,
                        shape_str(x)), 3)
  end
  local k = {}
  for i = 1, ns do k[i] = ws[2 + i] end
  local cols = im2col(x, k, o.stride, o.padding, o.dilation)  -- [N, O..., C*K]
  local cs = cols.shape
  local N, CK = cs[1], cs[#cs]
  local out = {}                                              -- O...
  local L = 1
  for i = 2, #cs - 1 do out[#out + 1] = cs[i]; L = L * cs[i] end
  local y
  if G == 1 then
    -- [N, L, CK] x [Cout, CK]^T -> [N, L, Cout] -> [N, Cout, L]
    y = matmul(cols:reshape{N, L, CK}, w:reshape{cout, CK}, {tb = true}):permute{0, 2, 1}
  else
    -- per group: [N, G, L, CK/G] x [G, Cout/G, CK/G]^T -> [N, G, L, Cout/G]
    local cg = cols:reshape{N, L, G, CK // G}:permute{0, 2, 1, 3}
    y = matmul(cg, w:reshape{G, cout // G, CK // G}, {tb = true}):permute{0, 1, 3, 2}
  end
  local shape = {N, cout}
  for _, d in ipairs(out) do shape[#shape + 1] = d end
  y = y:reshape(shape)
  if b then
    local bs = {cout}
    for _ = 1, ns do bs[#bs + 1] = 1 end
    y = y + b:reshape(bs)
  end
  return y
end

-- opts: stride, padding, dilation (a number or one per spatial dim;
-- 1, 0, 1), groups (1).
function nn.conv1d(x, w, b, opts)
  check_opts("nn.conv1d", opts, "stride:ints padding:ints dilation:ints groups:integer")
  return conv("nn.conv1d", 1, x, w, b, opts)
end

function nn.conv2d(x, w, b, opts)
  check_opts("nn.conv2d", opts, "stride:ints padding:ints dilation:ints groups:integer")
  return conv("nn.conv2d", 2, x, w, b, opts)
end

-- weight [cout, cin/groups, k...] (PyTorch's layout), bias [cout];
-- weight and bias uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) as PyTorch's
-- defaults, fan_in = cin/groups * prod(k).
local function Conv(fn, ns, name, cin, cout, kernel, opts)
  check_opts(fn, opts, "stride:ints padding:ints dilation:ints groups:integer bias:boolean " ..
                       "init:init")
  opts = opts or {}
  local G = opts.groups or 1
  local ci, co = size(cin), size(cout)
  if G < 1 or ci % G ~= 0 or co % G ~= 0 then
    error(string.format("%s: groups must divide in_channels and out_channels (got groups %d, " ..
                        "in %d, out %d)", fn, G, ci, co), 3)
  end
  local k = per_dim(kernel, ns)
  if type(k) ~= "table" or #k ~= ns then
    error(string.format("%s: kernel must be an integer or a table of %d integers (got %s)", fn,
                        ns, type(kernel)), 3)
  end
  local fan = ci // G
  local wshape = {cout, ci // G}
  for i = 1, ns do wshape[#wshape + 1] = k[i]; fan = fan * k[i] end
  local bound = 1 / math.sqrt(fan)
  local w = param(name .. ".weight", wshape, opts.init or uniform(-bound, bound))
  local b
  if opts.bias ~= false then b = param(name .. ".bias", {cout}, uniform(-bound, bound)) end
  local o = {stride = opts.stride, padding = opts.padding, dilation = opts.dilation, groups = G}
  local lname = ns == 1 and "nn.Conv1d" or "nn.Conv2d"
  return layer({w = w, b = b}, function(x) return conv(lname, ns, x, w, b, o) end)
end

function nn.Conv1d(name, cin, cout, kernel, opts)
  return Conv("nn.Conv1d", 1, name, cin, cout, kernel, opts)
end

function nn.Conv2d(name, cin, cout, kernel, opts)
  return Conv("nn.Conv2d", 2, name, cin, cout, kernel, opts)
end

-- 2d pooling over windows of kernel (stride default kernel, padding 0,
-- at most half the kernel): x [N, C, H, W] -> [N, C, OH, OW]. Max pooling
-- never picks padding; average pooling counts it as zeros (PyTorch's
-- count_include_pad).
local function pool2d(fn, x, kernel, opts, op)
  if type(x) ~= "userdata" or not x.rank or x.rank ~= 4 then
    error(string.format("%s: x must be a tensor [N, C, H, W] (got %s)", fn,
                        type(x) == "userdata" and x.rank and shape_str(x) or type(x)), 3)
  end
  opts = opts or {}
  local k = per_dim(kernel, 2)
  local p = per_dim(opts.padding, 2, 0)
  for i = 1, 2 do
    if p[i] * 2 > k[i] then
      error(string.format("%s: padding must be at most half the kernel (got padding %d, " ..
                          "kernel %d)", fn, p[i], k[i]), 3)
    end
  end
  local xs = x.shape
  local N, C = xs[1], xs[2]
  local cols = im2col(x, k, opts.stride or k, p)               -- [N, OH, OW, C*K]
  local cs = cols.shape
  local K = k[1] * k[2]
  local win = cols:reshape{N, cs[2], cs[3], C, K}
  local y
  if op == "max" then
    if p[1] > 0 or p[2] > 0 then
      -- where a window reads padding: -inf, so the max never takes it
      local inside = im2col(const(1, {1, 1, xs[3], xs[4]}, x.dtype), k, opts.stride or k, p)
      win = select(inside:reshape{1, cs[2], cs[3], 1, K}:gt(0), win, -math.huge)
    end
    y = win:max(-1)
  else
    y = win:mean(-1)
  end
  return y:permute{0, 3, 1, 2}
end

function nn.max_pool2d(x, kernel, opts)
  check_opts("nn.max_pool2d", opts, "stride:ints padding:ints")
  return pool2d("nn.max_pool2d", x, kernel, opts, "max")
end

function nn.avg_pool2d(x, kernel, opts)
  check_opts("nn.avg_pool2d", opts, "stride:ints padding:ints")
  return pool2d("nn.avg_pool2d", x, kernel, opts, "avg")
end

function nn.MaxPool2d(kernel, opts)
  check_opts("nn.MaxPool2d", opts, "stride:ints padding:ints")
  return layer({}, function(x) return pool2d("nn.MaxPool2d", x, kernel, opts, "max") end)
end

function nn.AvgPool2d(kernel, opts)
  check_opts("nn.AvgPool2d", opts, "stride:ints padding:ints")
  return layer({}, function(x) return pool2d("nn.AvgPool2d", x, kernel, opts, "avg") end)
end

-- Group normalisation: x [N, C, ...] in `groups` groups of channels, each
-- normalised over its channels and the spatial dims; w, b [C] per channel
-- (b may be nil).
function nn.groupnorm(x, groups, w, b, eps)
  local s = x.shape
  local N, C = s[1], s[2]
  if C % groups ~= 0 then
    error(string.format("nn.groupnorm: groups (%d) must divide the channels (got x %s)", groups,
                        shape_str(x)), 2)
  end
  local xg = x:reshape{N, groups, -1}
  local mu = xg:mean(-1, true)
  local xc = xg - mu
  local var = (xc * xc):mean(-1, true)
  local y = (xc * rsqrt(var + (eps or 1e-5))):reshape(s)
  local cs = {C}
  for _ = 3, #s do cs[#cs + 1] = 1 end
  if w then y = y * w:reshape(cs) end
  if b then y = y + b:reshape(cs) end
  return y
end

function nn.GroupNorm(name, groups, channels, opts)
  check_opts("nn.GroupNorm", opts, "eps:number affine:boolean")
  opts = opts or {}
  if size(channels) % groups ~= 0 then
    error(string.format("nn.GroupNorm: groups (%d) must divide channels (%d)", groups,
                        size(channels)), 2)
  end
  local w, b
  if opts.affine ~= false then
    w = param(name .. ".weight", {channels}, ones())
    b = param(name .. ".bias", {channels}, zeros())
  end
  return layer({w = w, b = b}, function(x)
    if type(x) ~= "userdata" or not x.rank or x.rank < 2 or x.shape[2] ~= size(channels) then
      error(string.format("nn.GroupNorm: x must be [N, %d, ...] (got %s)", size(channels),
                          type(x) == "userdata" and x.rank and shape_str(x) or type(x)), 2)
    end
    return nn.groupnorm(x, groups, w, b, opts.eps)
  end)
end

-- Batch normalisation over every axis but the channels (axis 1): x [N, C],
-- [N, C, L] or [N, C, H, W]. Training normalises with the batch's mean and
-- (biased) variance and moves the state name.running_mean and
-- name.running_var toward them (by momentum, the variance unbiased, as
-- PyTorch); evaluation (nn.training = false) normalises with the state.
-- w, b [C] (nil: none).
function nn.BatchNorm(name, channels, opts)
  check_opts("nn.BatchNorm", opts, "eps:number momentum:number affine:boolean")
  opts = opts or {}
  local eps, mom = opts.eps or 1e-5, opts.momentum or 0.1
  local rm = state(name .. ".running_mean", {channels}, zeros())
  local rv = state(name .. ".running_var", {channels}, ones())
  local w, b
  if opts.affine ~= false then
    w = param(name .. ".weight", {channels}, ones())
    b = param(name .. ".bias", {channels}, zeros())
  end
  local used = false
  return layer({w = w, b = b, running_mean = rm, running_var = rv}, function(x)
    if type(x) ~= "userdata" or not x.rank or x.rank < 2 or x.rank > 4 or
       x.shape[2] ~= size(channels) then
      error(string.format("nn.BatchNorm: x must be [N, %d], [N, %d, L] or [N, %d, H, W] " ..
                          "(got %s)", size(channels), size(channels), size(channels),
                          type(x) == "userdata" and x.rank and shape_str(x) or type(x)), 2)
    end
    if used and nn.training then
      error("nn.BatchNorm: a BatchNorm layer may be called once per step (its running " ..
            "statistics are assigned once)", 2)
    end
    used = true
    local axes, cs, n = {0}, {size(channels)}, x.shape[1]
    for a = 2, x.rank - 1 do
      axes[#axes + 1] = a
      cs[#cs + 1] = 1
      n = n * x.shape[a + 1]
    end
    local mu, var
    if nn.training then
      mu = x:mean(axes, true)                       -- [1, C, 1...]
      local xc = x - mu
      var = (xc * xc):mean(axes, true)
      local unb = n > 1 and n / (n - 1) or 1
      assign(rm, rm * (1 - mom) + mu:reshape{size(channels)} * mom)
      assign(rv, rv * (1 - mom) + var:reshape{size(channels)} * (mom * unb))
    else
      mu, var = rm:reshape(cs), rv:reshape(cs)
    end
    -- y = x * scale + shift with per-channel scale = w / sqrt(var + eps)
    -- and shift = b - mu * scale: one multiply-add per element each way
    local scale = rsqrt(var + eps)
    if w then scale = scale * w:reshape(cs) end
    local shift = -mu * scale
    if b then shift = shift + b:reshape(cs) end
    return x * scale + shift
  end)
end

-- Two-layer MLP: fc [C, hidden], act (default gelu), proj [hidden, C].
-- opts: bias (true), std, proj_std, act, dropout.
function nn.MLP(name, C, hidden, opts)
  check_opts("nn.MLP", opts,
             "bias:boolean std:number proj_std:number act:function dropout:number " ..
             "parallel:boolean")
  opts = opts or {}
  local fc = nn.Linear(name .. ".c_fc", C, hidden, {bias = opts.bias, std = opts.std,
                                                    parallel = opts.parallel and "column" or nil})
  local proj = nn.Linear(name .. ".c_proj", hidden, C,
                         {bias = opts.bias, std = opts.proj_std or opts.std,
                          parallel = opts.parallel and "row" or nil})
  local act = opts.act or nn.gelu
  return layer({c_fc = fc, c_proj = proj}, function(x)
    return nn.dropout(proj(act(fc(x))), opts.dropout)
  end)
end

-- SwiGLU: (silu(x @ w_gate) * (x @ w_up)) @ w_down.
function nn.swiglu(x, w_gate, w_up, w_down)
  return matmul(nn.silu(matmul(x, w_gate)) * matmul(x, w_up), w_down)
end

function nn.SwiGLU(name, C, hidden, opts)
  check_opts("nn.SwiGLU", opts, "std:number proj_std:number parallel:boolean")
  opts = opts or {}
  local std = opts.std or 0.02
  local g = param(name .. ".gate_proj.weight", {C, hidden}, normal(std))
  local u = param(name .. ".up_proj.weight", {C, hidden}, normal(std))
  local d = param(name .. ".down_proj.weight", {hidden, C}, normal(opts.proj_std or std))
  if opts.parallel then shard(g, 1); shard(u, 1); shard(d, 0) end
  return layer({gate = g, up = u, down = d}, function(x) return nn.swiglu(x, g, u, d) end)
end

return nn
