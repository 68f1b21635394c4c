-- gru_slices.lua - a byte-level GRU language model unrolled over T steps by
-- slicing one [B,T,3H] input projection per step (data = "text"). Each step
-- slices its [B,3H] row out of the projection, then the three gates out of
-- that row and out of the recurrent projection h @ Wh. Slice backward must
-- keep memory linear in T (issue 13, item 14): test_autodiff.c compiles it
-- at two T and compares the planned peaks; test_fuse.c checks the fused CPU
-- step against the reference interpreter.
--
-- Config keys (change with --set key=value):
--   T 16, batch 4, C 16 (embedding), hidden 16 (H), steps 20, lr 3e-3
--   slices 1: as above; 0: the same GRU with no float slice (each step
--     embeds its own tokens, one weight per gate), to compare planned peaks
--
-- Inputs:  tokens i32[B,T], targets i32[B,T].
-- Outputs: loss (mean cross-entropy over every step).
local cfg = config{T = 16, batch = 4, C = 16, hidden = 16, steps = 20, lr = 3e-3, slices = 1}
local B, T, C, H, V = cfg.batch, cfg.T, cfg.C, cfg.hidden, 256
sym{B = B, T = T, C = C, H = H, V = V}

local tokens = input("tokens", {B, T}, "i32")
local targets = input("targets", {B, T}, "i32")

local wte = nn.Embedding("wte", V, C, {std = 0.1})
local head = nn.Linear("head", H, V, {std = 0.02})
local h = const(0, {B, H})
local loss = nil

local function step_loss(t)
  local lt = nn.cross_entropy(head(h), targets:slice(1, t, t + 1):reshape({B}))
  loss = loss and loss + lt or lt
end

if cfg.slices == 1 then
  local wx = param("gru.wx", {C, 3 * H}, normal(1 / math.sqrt(C)))
  local bx = param("gru.bx", {3 * H}, zeros())
  local wh = param("gru.wh", {H, 3 * H}, normal(1 / math.sqrt(H)))
  local xp = wte(tokens):matmul(wx) + bx            -- [B,T,3H]
  for t = 0, T - 1 do
    local xt = xp:slice(1, t, t + 1):reshape({B, 3 * H})  -- [B,3H]
    local hp = h:matmul(wh)                                -- [B,3H]
    local r = sigmoid(xt:slice(1, 0, H) + hp:slice(1, 0, H))
    local z = sigmoid(xt:slice(1, H, 2 * H) + hp:slice(1, H, 2 * H))
    local n = tanh(xt:slice(1, 2 * H, 3 * H) + r * hp:slice(1, 2 * H, 3 * H))
    h = (1 - z) * n + z * h
    step_loss(t)
  end
else
  local w = {}
  for _, gname in ipairs({"r", "z", "n"}) do
    w[gname] = {x = param("gru.wx_" .. gname, {C, H}, normal(1 / math.sqrt(C))),
                b = param("gru.bx_" .. gname, {H}, zeros()),
                h = param("gru.wh_" .. gname, {H, H}, normal(1 / math.sqrt(H)))}
  end
  for t = 0, T - 1 do
    local et = wte(tokens:slice(1, t, t + 1):reshape({B}))  -- [B,C]
    local function pre(gname) return et:matmul(w[gname].x) + w[gname].b end
    local r = sigmoid(pre("r") + h:matmul(w.r.h))
    local z = sigmoid(pre("z") + h:matmul(w.z.h))
    local n = tanh(pre("n") + r * h:matmul(w.n.h))
    h = (1 - z) * n + z * h
    step_loss(t)
  end
end

minimize(loss / T)
train{data = "text", data_path = "tests/data/tiny.txt", batch = B, steps = cfg.steps,
      lr = cfg.lr, warmup = 0, val_fraction = 0.2, eval_every = 0}
