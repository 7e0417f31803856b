import json,math,statistics as st
files=['reproduce_h200_session11_r6','reproduce_h100_session14_r6','reproduce_h100_session16','reproduce_h100_session17']
for comb in ['linear','quad']:
  for delta in [0,20,25,30,40]:
    tot=ins=0; hw=[]; per=[]; small=[0,0]
    for f in files:
        d=json.load(open(f'benchmarks/results/{f}.json'))
        fi=fc=0; fhw=[]
        for o in d['per_operator']:
            if not o.get('ref_median_us') or not o.get('log_parts'): continue
            c=math.log(o['speedup']); w,b=o['log_parts']
            t=o['ref_median_us']; to=t/o['speedup']
            tau=delta/1000*math.sqrt(1/t**2+1/to**2)
            w2=math.sqrt(w**2+(1.96*math.sqrt(2)*tau)**2)
            half=w2+b if comb=='linear' else math.hypot(w2,b)
            for x in o['reruns']:
                fc+=1; ok= x is not None and abs(math.log(x)-c)<=half; fi+=ok
                if t<8: small[0]+=ok; small[1]+=1
            if t>=5: hw.append(math.expm1(half)); fhw.append(math.expm1(half))
        tot+=fc; ins+=fi; per.append(f"{fi}/{fc} hw{st.median(fhw)*100:.2f}")
    print(comb, delta, f"{ins}/{tot}={ins/tot:.3f}", '<8us %d/%d'%tuple(small), 'median hw>=5us %.2f%%' % (st.median(hw)*100), per)
