-- cnn.lua - a small convolutional classifier of S x S one-channel images
-- (data = "tensors": tests/cli/train_cnn.sh writes a set of oriented bars,
-- tests/cli/lib/arrays.sh's bars_xy). Two 3x3 convolutions, batch
-- normalisation (running statistics in evaluation), max pooling, group
-- normalisation, global average pooling and a linear head.
--
-- Config keys (change with --set key=value):
--   batch    32    examples per step (B)
--   size     8     image height and width (S; a multiple of 2)
--   width    16    channels of the second convolution (the first has half)
--   classes  3     classes (K)
--   steps, lr     training length and peak learning rate
--
-- Inputs:  x f32[B,1,S,S] images, y i32[B] class ids in [0, K).
-- Outputs: loss (mean cross-entropy), logits f32[B,K].
local cfg = config{batch = 32, size = 8, width = 16, classes = 3, steps = 300, lr = 3e-2}
sym{B = cfg.batch, S = cfg.size, K = cfg.classes}

local x = input("x", {"B", 1, "S", "S"}, "f32")
local y = input("y", {"B"}, "i32")

local c1 = nn.Conv2d("conv1", 1, cfg.width // 2, 3, {padding = 1, bias = false})
local bn = nn.BatchNorm("bn1", cfg.width // 2)
local pool = nn.MaxPool2d(2)
local c2 = nn.Conv2d("conv2", cfg.width // 2, cfg.width, 3, {padding = 1})
local norm = nn.GroupNorm("norm2", 4, cfg.width)
local gap = nn.AvgPool2d(cfg.size // 2)
local head = nn.Linear("head", cfg.width, "K")

local h = pool(relu(bn(c1(x))))                  -- [B, W/2, S/2, S/2]
h = relu(norm(c2(h)))                            -- [B, W, S/2, S/2]
h = gap(h):reshape{cfg.batch, cfg.width}         -- [B, W]
local logits = head(h)

minimize(nn.cross_entropy(logits, y))
output("logits", logits)
train{data = "tensors", batch = cfg.batch, steps = cfg.steps, lr = cfg.lr, warmup = 10,
      min_lr = cfg.lr / 10, eval_every = 100}
