-- train{} with a key TrainCfg does not have
local x = input("x", {4, 8})
minimize(x:sum())
train{steps = 10,
      lr = 1e-3}
train{stepz = 10} -- ERROR
