-- the script raises its own error
local cfg = config{C = 30, H = 4}
if cfg.C % cfg.H ~= 0 then
  error("C must be divisible by H") -- ERROR
end
